"""The path a cluster's users take, for real: a JupyterHub whose servers are Slurm jobs.

JupyterHub (PyPI) with batchspawner's SlurmSpawner and its proxy (npm's
configurable-http-proxy, installed into the venv by scripts/setup.sh), configured by
tests/jupyterhub_config.py, all on loopback, in front of the real two-node test Slurm
(tests/slurm_cluster.py). A local user, created here and removed afterwards, logs in with
a password (PAM) in headless Chromium, starts the server (the hub submits it as a job of
the user), opens chapter 9, sets the Slurm engines in a new cell below the parameters (as a
reader would) and runs the chapter's cells up to "nothing is left behind": the engines are
submitted from inside the server's job. Then the reader stops the server on the hub's home
page, and no job, engine, controller or process of the user is left.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

import slurm_cluster
import slurm_conf

from guide_utils.cluster import watchdog
from guide_utils.runtime.ports import free_ports

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "scripts"))
import browse_book  # noqa: E402

CHAPTER = "notebooks/09_interactive_ipyparallel.ipynb"
# The cells of chapter 9, counted from 0 once the reader's cell is in (below the parameters).
PARAMETERS, SETUP, INTERACTIVE, LEFT = 1, 3, 5, 7


def _missing() -> str | None:
    """What this machine lacks for the test (scripts/setup.sh installs all of it), or None."""
    if os.geteuid() != 0:
        return "needs root: it creates a local user and runs the hub as root"
    missing = [name for name in ("jupyterhub", "batchspawner-singleuser", "jupyterhub-singleuser",
                                 "configurable-http-proxy") if not (BIN / name).exists()]
    missing += [tool for tool in ("useradd", "userdel", "chpasswd", "runuser") if not shutil.which(tool)]
    if browse_book.have_browser():
        missing.append(browse_book.have_browser())
    return f"missing {', '.join(missing)} (scripts/setup.sh installs them)" if missing else None


pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.multiprocess,
              pytest.mark.skipif(_missing() is not None, reason=f"no JupyterHub here: {_missing()}")]

@pytest.fixture(scope="module")
def test_slurm():
    """The test Slurm, in a folder the test user may enter: its sbatch reads the cluster's
    slurm.conf and talks to its munge socket there (pytest's own temporary folders are
    root's alone)."""
    root = Path(tempfile.mkdtemp(prefix="guide-hub-slurm-"))
    root.chmod(0o755)
    cluster = slurm_cluster.start_or_skip(slurm_cluster.SlurmCluster(root))
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _user_processes(uid: int) -> list:
    import psutil

    found = []
    for proc in psutil.process_iter(["uids"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["uids"] and proc.info["uids"].real == uid:
                found.append(proc)
    return found


@pytest.fixture
def hub_user():
    """A local user with a password and a copy of chapter 9 in its home; removed afterwards
    with its home, after ending the processes it still has (the test's own, by their ids)."""
    name, password = f"guidehub{secrets.token_hex(3)}", secrets.token_urlsafe(12)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True, capture_output=True)
    try:
        subprocess.run(["chpasswd"], input=f"{name}:{password}\n", text=True, check=True, capture_output=True)
        entry = pwd.getpwnam(name)
        home = Path(entry.pw_dir)
        (home / "notebooks").mkdir()
        shutil.copy(REPO / CHAPTER, home / CHAPTER)
        for path in (home / "notebooks", home / CHAPTER):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        yield name, password, entry.pw_uid, home
    finally:
        with contextlib.suppress(KeyError):
            watchdog.end_processes(_user_processes(pwd.getpwnam(name).pw_uid))
        subprocess.run(["userdel", "--remove", name], capture_output=True)


def _let_users_run_the_venv(cluster) -> None:
    """Jobs of an ordinary user must run the guide's venv, whose interpreter may lie below a
    folder only root may enter (here a pyenv Python under /root). In the test Slurm's mount
    namespace only (jobs see that one; the host keeps its permissions), such a folder is
    covered by a tmpfs that others may traverse, and the one entry the venv needs from it is
    bound back in."""
    needed: dict[Path, set[str]] = {}
    for path in (Path(os.path.realpath(sys.executable)), BIN.resolve()):
        for folder in reversed(path.parents):
            if not folder.stat().st_mode & stat.S_IXOTH:
                needed.setdefault(folder, set()).add(path.relative_to(folder).parts[0])
                break
    for folder, entries in needed.items():
        lines = ["set -e"]
        for i, entry in enumerate(sorted(entries)):
            lines += [f'mkdir -p "$0/stage{i}"', f'mount --bind "{folder / entry}" "$0/stage{i}"']
        lines.append(f'mount -t tmpfs -o mode=0711,size=1m tmpfs "{folder}"')
        for i, entry in enumerate(sorted(entries)):
            lines += [f'mkdir "{folder / entry}"', f'mount --move "$0/stage{i}" "{folder / entry}"']
        cluster.in_namespace("sh", "-c", "\n".join(lines), str(cluster.root))


@pytest.fixture
def hub(test_slurm, hub_user, tmp_path):
    """The hub, as root, on free loopback ports; stopped (and its servers with it) afterwards."""
    _let_users_run_the_venv(test_slurm)
    ports = free_ports(3)
    env = {**os.environ, "SLURM_CONF": test_slurm.env["SLURM_CONF"], "GUIDE_HUB_DIR": str(tmp_path),
           "GUIDE_HUB_PORTS": ",".join(map(str, ports)), "GUIDE_HUB_USER": hub_user[0],
           "GUIDE_HUB_NODES": ",".join(slurm_conf.NODES), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    log = open(tmp_path / "jupyterhub.log", "w")
    proc = subprocess.Popen([str(BIN / "jupyterhub"), "-f", str(REPO / "tests/jupyterhub_config.py")], env=env,
                            cwd="/", stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{ports[0]}"
    end = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError):
            if urllib.request.urlopen(f"{url}/hub/health", timeout=2).status == 200:
                break
        if proc.poll() is not None or time.monotonic() > end:
            pytest.fail("the hub did not come up:\n" + (tmp_path / "jupyterhub.log").read_text()[-3000:])
        time.sleep(0.25)
    try:
        yield url, tmp_path / "jupyterhub.log"
    finally:
        proc.send_signal(signal.SIGTERM)  # the hub stops its proxy and (cleanup_servers) every server
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):  # the proxy too, if the hub left it
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def test_a_user_runs_chapter_9_on_the_hub_with_engines_from_inside_the_servers_job(hub, hub_user, test_slurm):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    url, hub_log = hub
    name, password, uid, home = hub_user
    driver = browse_book.start_browser()
    start = time.monotonic()
    steps: list[str] = []

    def step(what: str) -> None:
        steps.append(f"{time.monotonic() - start:5.1f} s  {what}")

    def cells():
        return driver.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")

    def prompt(i: int) -> str:
        return cells()[i].find_element(By.CSS_SELECTOR, ".jp-InputPrompt").text.strip()

    def output(i: int) -> str:
        return cells()[i].find_element(By.CSS_SELECTOR, ".jp-Cell-outputWrapper").text

    def idle(d) -> bool:
        return "Idle" in d.find_element(By.CSS_SELECTOR, ".jp-Notebook-ExecutionIndicator").get_attribute("textContent")

    def keys(*k: str) -> None:
        ActionChains(driver).send_keys(*k).perform()

    def run_cell() -> None:  # Shift+Enter: run the selected cell, select the next
        ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()

    def diagnosis() -> str:
        shot = hub_log.with_name("failure.png")
        driver.save_screenshot(str(shot))
        logs = "\n".join(f"--- {p}\n" + p.read_text(errors="replace")[-2500:]
                         for p in [hub_log, *sorted(home.glob("jupyterhub-*.log")), *sorted(home.glob("logs/*.out"))])
        return "\n".join(steps) + f"\nthe browser's page: {shot}\n" + logs

    job_ids: list[str] = []
    try:
        driver.get(f"{url}/hub/login")
        driver.find_element(By.ID, "username_input").send_keys(name)
        driver.find_element(By.ID, "password_input").send_keys(password)
        driver.find_element(By.ID, "login_submit").click()
        WebDriverWait(driver, 30).until(lambda d: d.current_url.endswith("/hub/home"))
        step("logged in")
        driver.find_element(By.ID, "start").click()
        WebDriverWait(driver, 150).until(lambda d: f"/user/{name}/lab" in d.current_url)
        step("server started")
        jobs = subprocess.run(["squeue", "-h", "-u", name, "-o", "%i %j %T %N"], capture_output=True, text=True,
                              env=test_slurm.env).stdout.split("\n")
        server = [line.split() for line in jobs if f"jupyterhub-{name}" in line]
        assert server and server[0][2] == "RUNNING", jobs
        job_ids.append(server[0][0])

        driver.get(f"{url}/user/{name}/lab/tree/{CHAPTER}")
        # the kernel imports the chapter's stack as it starts: more than 60 s on a busy machine
        WebDriverWait(driver, 180).until(lambda d: len(cells()) >= 12 and idle(d))
        step("chapter 9 open, kernel idle")
        cells()[PARAMETERS].find_element(By.CSS_SELECTOR, ".jp-InputPrompt").click()
        keys(Keys.ESCAPE, "b", Keys.ENTER)  # a new cell below the parameters, in edit mode
        keys('engines = "slurm"; epochs = 1  # engines as a Slurm job, submitted from this server\'s job')
        keys(Keys.ESCAPE)
        assert 'engines = "slurm"' in cells()[PARAMETERS + 1].text
        cells()[PARAMETERS].find_element(By.CSS_SELECTOR, ".jp-InputPrompt").click()
        keys(Keys.ESCAPE)
        for _ in range(PARAMETERS, LEFT + 1):
            run_cell()
            time.sleep(0.2)
        WebDriverWait(driver, 600, 0.5).until(lambda d: prompt(LEFT) not in ("", "[ ]:", "[*]:") and idle(d))
        step("cells run")
        text = {i: output(i) for i in (SETUP, INTERACTIVE, LEFT)}
        for i, out in text.items():
            assert "Traceback" not in out, f"cell {i}:\n{out}"
        assert 'EngineCluster(n=2, engines="slurm")' in text[SETUP]
        cluster = text[INTERACTIVE].split("<EngineCluster ", 1)[1].split(":", 1)[0]
        engines_job = text[INTERACTIVE].split("(Slurm job ", 1)[1].split(")", 1)[0]
        job_ids.append(engines_job)
        assert text[INTERACTIVE].count("[train] epoch 1/1") == 2, text[INTERACTIVE]  # Horovod, then DDP
        assert f"engines: Slurm job {engines_job} RUNNING" in text[INTERACTIVE]
        assert text[LEFT].endswith("0 process(es) left"), text[LEFT]
        # the engines ran in a job of their own, submitted by the user from inside the server's job
        records = test_slurm.jobs(engines_job)
        assert records and records[0]["UserId"].startswith(f"{name}("), records

        driver.get(f"{url}/hub/home")
        WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "stop").is_displayed())
        driver.find_element(By.ID, "stop").click()
        WebDriverWait(driver, 60).until(lambda d: d.find_element(By.ID, "start").is_displayed()
                                        and not d.find_element(By.ID, "stop").is_displayed())
        step("server stopped")
    except Exception as exc:
        raise AssertionError(f"{exc!r}\n{diagnosis()}") from exc
    finally:
        driver.quit()

    end = time.monotonic() + 60
    while True:
        queued = subprocess.run(["squeue", "-h", "-o", "%i %u %T"], capture_output=True, text=True,
                                env=test_slurm.env).stdout.strip()
        left = _user_processes(uid) + watchdog.processes_of(cluster)
        if not queued and not left:
            break
        assert time.monotonic() < end, f"left after the server stopped: squeue {queued!r}, processes " \
                                       f"{[p.cmdline()[:3] for p in left]}\n" + "\n".join(steps)
        time.sleep(0.5)
    assert all(test_slurm.finished(j) for j in job_ids)
    step("no job, engine, controller or process of the user left")
    print("\n" + "\n".join(steps))
