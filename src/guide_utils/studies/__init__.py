"""The studies layer, above results: named sets of runs. A study is one module of this package
that declares ``STUDY``, a page of declarations on ``study.Study`` (points x seeds x thread
counts, run resumably in fresh workers: ``workers``; one CSV with one provenance line:
``study_csv``; a summary of medians, worst runs and n of N near the baseline it declares).
``registry`` finds them, so this text lists none: ``python -m guide_utils --help`` shows them
all, the thesis's nine experiments at two scales (``experiments``, planned in
``experiment_plans``) and the quality sweeps among them. Beside them: the reader's check that
the recorded sweep's conclusions hold on their machine (``verify``), and the
distributed-training pitfalls and gradient accumulation shown at laptop scale (``pitfalls``,
``accumulation``)."""
