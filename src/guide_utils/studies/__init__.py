"""The studies layer, above results: named sets of runs. A study is a page of declarations
on ``study.Study`` (points x seeds x thread counts, run resumably in fresh workers:
``workers``; one CSV with one provenance line: ``study_csv``; a summary of medians, worst
runs and n of N near the baseline). The thesis's nine experiments at two scales
(``experiments``), the quality sweep over the scaling factor k (``sweep``), the same
question past the linear rule (``large_batch``), the reader's check that they hold on their
machine (``verify``), and the distributed-training pitfalls that reproduce at laptop scale (``pitfalls``)."""
