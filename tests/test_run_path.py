"""One launch path: notebooks start launchers, workers and tools through runtime.local.run only.

The call prints the shell-quoted command, runs it in the workers' environment and returns
run records or the completed output; a failure or a timeout is one line with the output's tail.
"""

import json
import shlex
import sys
import time
from pathlib import Path

import nbformat
import pytest

from guide_utils.core.errors import GuideError
from guide_utils.runtime import local

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
BY_HAND = ("subprocess", "Popen", "os.system")
PY = sys.executable


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_notebook_cell_starts_processes_by_hand(path):
    """Command lines, environments and exit checks built in a cell drift apart from the
    library's; a cell calls guide_utils.runtime.local.run instead."""
    for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type == "code":
            found = [word for word in BY_HAND if word in cell.source]
            assert not found, f"{path.name} cell {i} uses {found[0]}: start it with guide_utils.runtime.local.run"


def test_a_command_that_succeeds_returns_its_run_records(tmp_path, capsys):
    code = ("import sys; from guide_utils.core.records import RunRecorder; "
            "r = RunRecorder(sys.argv[1], 'demo', config={'workers': 1}); r.epoch(epoch=1, val_top1_err=9.5)")
    (tmp_path / "older.jsonl").write_text(json.dumps({"type": "config", "run": "older", "config": {}}) + "\n")
    runs = local.run([PY, "-c", code, str(tmp_path)], records=tmp_path)
    assert [r.name for r in runs] == ["demo"]  # only what this command wrote
    assert runs[0].epochs["val_top1_err"].tolist() == [9.5]
    assert capsys.readouterr().out.startswith("$ python -c ")


def test_without_records_it_returns_the_output_and_echoes_rank_0(capsys):
    done = local.run([PY, "-c", "print('[0]<stdout>:verdict: ok'); print('[1]<stdout>:verdict: ok'); print('x')"],
                     echo="verdict")
    assert done.returncode == 0 and "x" in done.stdout
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "verdict: ok" and out.count("verdict: ok") == 1


def test_the_printed_command_is_the_shell_quoted_one(capsys):
    argv = [PY, "-c", "print('a b')", "--flag=it's", str(local.BIN / "horovodrun")]
    local.run(argv, env={"TF_CONFIG": '{"task": {"index": 0}}', "OMP_NUM_THREADS": "1"}, dry_run=True)
    printed = capsys.readouterr().out
    assert printed.startswith("$ ") and printed.count("\n") >= 1
    typed = shlex.split(printed[2:].replace("\\\n", " "))
    assert typed == ['TF_CONFIG={"task": {"index": 0}}', "OMP_NUM_THREADS=1", "python", "-c", "print('a b')",
                     "--flag=it's", "horovodrun"]
    assert all(len(line) <= local.WIDTH + 4 for line in printed.splitlines())


def test_a_failing_command_raises_one_line_with_the_tail_of_its_output():
    code = "import sys; print('working'); print('first', file=sys.stderr); sys.exit('the real reason')"
    with pytest.raises(GuideError) as err:
        local.run([PY, "-c", code], show=False)
    message = str(err.value)
    assert "\n" not in message and "exited 1" in message and message.endswith("first | the real reason")
    assert "python -c" in message  # which command failed


def test_a_worker_s_error_line_is_not_buried_by_the_launcher_s_summary():
    """torchrun ends a failed run with its own lines; the worker's one-line error leads."""
    code = ("import sys; print('prog: error: unrecognized arguments: --bogus', file=sys.stderr); "
            "[print(f'launcher summary {i}', file=sys.stderr) for i in range(4)]; sys.exit(1)")
    with pytest.raises(GuideError) as err:
        local.run([PY, "-c", code], show=False)
    assert "exited 1: prog: error: unrecognized arguments: --bogus | launcher summary 1" in str(err.value)
    assert str(err.value).endswith("launcher summary 3")


def test_a_timeout_is_one_line_and_stops_the_command(tmp_path):
    marker = tmp_path / "finished"
    code = f"import time; print('started', flush=True); time.sleep(20); open({str(marker)!r}, 'w')"
    began = time.monotonic()
    with pytest.raises(GuideError) as err:
        local.run([PY, "-c", code], timeout=2, show=False)
    assert time.monotonic() - began < 10
    message = str(err.value)
    assert "\n" not in message and "did not finish in 2 s" in message and "started" in message
    time.sleep(0.5)
    assert not marker.exists()


def test_several_tf_config_workers_start_at_once(tmp_path, capsys):
    """Each worker waits until every worker has started: run one after the other, they
    would time out."""
    code = ("import json, os, pathlib, sys, time; cfg = json.loads(os.environ['TF_CONFIG']); "
            "d = pathlib.Path(sys.argv[1]); (d / str(cfg['task']['index'])).touch(); "
            "n = len(cfg['cluster']['worker']); end = time.time() + 20\n"
            "while len(list(d.iterdir())) < n and time.time() < end: time.sleep(0.05)\n"
            "print(cfg['task']['index'], len(list(d.iterdir())))")
    done = local.run([PY, "-c", code, str(tmp_path)], each=local.tf_config(3), timeout=15)
    assert [p.stdout.split() for p in done] == [["0", "3"], ["1", "3"], ["2", "3"]]
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == "$ wait" and sum(line.endswith(" &") for line in printed) == 3
    ports = {tuple(json.loads(e["TF_CONFIG"])["cluster"]["worker"]) for e in local.tf_config(2)}
    assert len(ports) == 1 and len(next(iter(ports))) == 2


def test_one_failing_worker_stops_the_others():
    code = ("import json, os, sys, time; i = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
            "if i == 1: sys.exit('worker 1 gave up')\n"
            "time.sleep(30)")
    began = time.monotonic()
    with pytest.raises(GuideError, match=r"process 2 of 2\) exited 1: worker 1 gave up"):
        local.run([PY, "-c", code], each=local.tf_config(2), show=False)
    assert time.monotonic() - began < 10


def test_a_printed_tf_config_command_fits_the_page_and_names_the_scratch_folder(tmp_path, capsys):
    """What chapter 8 prints: the same on every machine (no temporary folder's name) and no
    wider than the book's column; the TF_CONFIG each worker gets is still the JSON it expects."""
    configs = local.tf_config(2)
    argv = [sys.executable, "-c", "pass", "--results-dir", str(tmp_path / "mwms")]
    local.run(argv, each=configs, aliases={tmp_path: "$RESULTS"})
    printed = capsys.readouterr().out
    assert str(tmp_path) not in printed and "--results-dir $RESULTS/mwms &" in printed
    assert all(len(line) <= local.WIDTH + 4 for line in printed.splitlines()), printed
    for i, env in enumerate(configs):
        config = json.loads(env["TF_CONFIG"])
        assert config["task"] == {"type": "worker", "index": i} and len(config["cluster"]["worker"]) == 2
    # the printed line, as a shell reads it, gives the first worker the same TF_CONFIG
    first = printed.split(" &\n")[0].removeprefix("$ ").replace(" \\\n", " ")
    assert shlex.split(first)[0] == "TF_CONFIG=" + configs[0]["TF_CONFIG"]
