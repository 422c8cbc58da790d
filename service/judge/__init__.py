"""Judge stage: an LLM judge on a deterministic, targeted sample, without ever blocking the stream.

``definitions`` (judges/<name>/) → ``sampling`` (the pipeline's downstream stage: enqueue only) →
``store`` (leased queue) → ``worker`` (claims, calls through ``engine`` under ``limits``; the model is
reached only through ``client``, the one module importing litellm) → ``parse`` → ``verdicts``.
``prompt`` renders transcripts as delimited data, ``offline`` is the no-key judge, ``pairwise``
compares two answers in both orders, ``api`` and ``commands`` expose it all.
"""
