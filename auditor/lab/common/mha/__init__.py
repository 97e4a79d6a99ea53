"""Multi-head attention memorization (Paper A), shared by the ``memorize``, ``certify`` and ``capacity``
rooms: random labelled sequences (``data``), the layer as a batched ensemble (``model``), its loss and
memorization count (``task``), training to convergence in rounds (``train``, with ``saturation`` of the
softmax), the rank certificates of its attention features (``certify``), the figures (``plots``) and the
stored bits of its rows (``bits``)."""
