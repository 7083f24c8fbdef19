"""Writing stores: shards are built locally (writer.py, columns.py), then committed through a commit
target (target.py): a local directory (local.py; disk.py, index.py, journal.py) or object storage
(objects.py; remote.py, remote_commit.py, state.py). api.py opens a target for a path or URL and holds
``create``/``append_to``/``open_or_create``; parts.py is the distributed-write primitive."""
