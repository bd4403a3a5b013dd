"""What a chapter shows beside its figures, in three modules that the notebooks import by name
(``from crsrepro.present.report import html, numbers, tables``):

- :mod:`~crsrepro.present.report.tables`: the result tables and inventories, one function per table;
- :mod:`~crsrepro.present.report.html`: the boxes (the frame's warning, the notes, the "paper vs this
  run" box) and the glue that hands the prose its numbers;
- :mod:`~crsrepro.present.report.numbers`: this run's numbers that each chapter's prose quotes, one
  function per chapter (:mod:`crsrepro.present.chapters` names them).

Each reads a :class:`crsrepro.analyse.run_analysis.RunAnalysis` (or a table of it) and computes nothing
the analysis does not (DESIGN.md section 12).
"""
