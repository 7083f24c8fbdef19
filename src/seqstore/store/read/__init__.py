"""The parts :class:`seqstore.Store` owns, each with its own state (``store/reader.py`` builds them);
docs/architecture.md ("``store/read/``: the parts of ``Store``") says which module holds which part.
"""
