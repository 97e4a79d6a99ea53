"""What several rooms of the lab use, one level below them: a room imports the lab's shared modules
(``auditor/lab/*.py``), this package and its own folder, never another room. Not a room itself
(:data:`auditor.lab.room.SHARED`).

``mha``: multi-head attention memorization (Paper A): its data, model, task, training, certificates,
saturation and figures, used by ``memorize``, ``certify`` and ``capacity``. ``search``: capacity by
threshold search with its plateau rule, fits, summaries and figures, used by ``assoc`` and ``recall``.
"""
