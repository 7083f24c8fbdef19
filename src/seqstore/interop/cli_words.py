"""Library error messages in the command line's spelling: the Python option names they suggest (``pass
overwrite=True``) replaced by the commands' options (``pass --overwrite``), so that an error of ``seqstore
convert`` / ``export`` names what a user of the commands can type."""

from __future__ import annotations

__all__ = ["CLI_WORDS", "cli_message"]

#: Python spellings in library messages -> the command line's options (errors of the commands speak CLI).
CLI_WORDS = {
    "pass overwrite=True": "pass --overwrite",
    "columns={column: field}": "--map COLUMN=FIELD",
    "rename={stream: field}": "--rename STREAM=FIELD",
    "fields={field: key}": "--field FIELD=KEY",
    "features=True": "--features",
    "audio=True": "--audio",
    "audio=False": "--no-audio",
    "import it with import_hf": "convert it with --from hf",
    "import it with import_arrow": "convert it with --from arrow",
    "import it with import_parquet": "convert it with --from parquet",
    "channels='first' or channels='mix'": "--channels first or --channels mix",
    "split=NAME": "--split NAME",
    "pass another id_column (or None)": "pass another --id-column (or --id-column none)",
    "storage_options are for URLs": "-o options are for URLs",
    "; pass dtype=...": "; pass --dtype ...",
    "pass keys='index'": "pass --keys index",
    "pass strict=False": "pass --skip-unknown",
    "fields={ext: field}": "--ext EXT=FIELD",
    "fields={field: ext}": "--ext FIELD=EXT",
    "pass documents=": "pass --documents FIELD (or --documents none)",
    "pass inputs=": "pass --inputs FIELD (or --inputs none)",
    "leave it out with fields=": "leave it out with --fields A,B",
}


def cli_message(exc: BaseException) -> str:
    """The message of an error raised by the library, with its Python option names in CLI spelling."""
    msg = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    for py, cli in CLI_WORDS.items():
        msg = msg.replace(py, cli)
    return msg
