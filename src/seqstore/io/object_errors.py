"""obstore's errors in seqstore's words, for the obstore back end (:mod:`.object_obstore`).

:func:`failure` maps an exception a request met to a seqstore error (a missing object or bucket, refused or
missing credentials, a changed object, a refused configuration, a certificate for another host) or to a
:class:`~seqstore.io.retry.Transient` failure to retry; :func:`config_error` and :func:`unknown_key` refuse a
client configuration, naming the option and the valid keys. Messages never carry obstore's debug dumps.
"""

from __future__ import annotations

import difflib
import re
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from ..errors import (
    BucketNotFound,
    ConfigError,
    ConflictError,
    CredentialsError,
    RemoteError,
    RemoteNotFound,
    StaleStoreError,
)
from .object_common import SEQSTORE_OPTIONS
from .object_common import error_at as _at
from .retry import Transient

__all__ = ["client_takes", "config_error", "failure", "not_found", "service_of", "short", "unknown_key",
           "unknown_local_key"]

#: the configuration keys obstore takes for each service (its short spellings; it also accepts them with an
#: ``aws_``/``google_``/``azure_`` prefix or in upper case), for the message that refuses an unknown key
_SERVICE_KEYS = {
    "S3": (
        "access_key_id", "bucket", "checksum_algorithm", "conditional_put", "container_authorization_token_file",
        "container_credentials_full_uri", "container_credentials_relative_uri", "copy_if_not_exists",
        "default_region", "disable_bulk_delete", "disable_tagging", "endpoint", "metadata_endpoint", "region",
        "request_payer", "role_arn", "role_session_name", "secret_access_key", "server_side_encryption",
        "session_token", "skip_signature", "sse_bucket_key_enabled", "sse_kms_key_id", "sts_endpoint",
        "unsigned_payload", "virtual_hosted_style_request", "web_identity_token_file",
    ),
    "GCS": ("application_credentials", "base_url", "bearer_token", "bucket", "service_account",
            "service_account_key", "skip_signature"),
    "Azure": (
        "account_key", "account_name", "authority_host", "client_id", "client_secret", "container_name",
        "credential_type", "disable_tagging", "encryption_key", "endpoint", "federated_token_file", "msi_endpoint",
        "msi_resource_id", "object_id", "sas_key", "skip_signature", "tenant_id", "token", "use_azure_cli",
        "use_emulator", "use_fabric_endpoint",
    ),
    "HTTP": (),
}
#: client options seqstore passes on to obstore's HTTP client (any service)
_CLIENT_KEYS = ("allow_http", "allow_invalid_certificates", "http1_only", "proxy_url", "user_agent")
#: phrases of obstore errors raised before a request was sent (misconfiguration: retrying cannot help)
_REFUSALS = (
    "builder error", "URL scheme is not allowed", "Version required", "ETag required", "Missing bucket name",
    "Missing AccessKeyId", "Missing SecretAccessKey", "Account must be specified", "Unable to recognise URL",
    "Generating SAS", "Configuration key",
)
#: what a request to the instance-metadata and container services names (where obstore looks for credentials
#: it was not given: AWS's IMDS and ECS, GCE's metadata server, Azure's managed identity)
_LOOKUPS = ("/latest/api/token", "/latest/meta-data/", "169.254.170.2", "computeMetadata/", "/metadata/identity/")
#: where each service's credentials come from, for the error that says none were found
_CREDENTIALS = {
    "S3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary keys) in the "
          "environment, or the storage options access_key_id and secret_access_key",
    "GCS": "set GOOGLE_APPLICATION_CREDENTIALS (or GOOGLE_SERVICE_ACCOUNT) in the environment, or the storage "
           "option service_account or application_credentials",
    "Azure": "set AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_KEY) in the environment, or the storage option "
             "account_key or sas_key",
}
#: what a service answers for a bucket (container) that does not exist
_NO_BUCKET = ("NoSuchBucket", "ContainerNotFound", "bucket does not exist", "container does not exist")
#: phrases of obstore errors about an answer that came but was wrong (a body cut short, another range, a
#: header missing): the server answered, so the endpoint is reachable
_ANSWERED = (
    "response body error", "error decoding response body", "Content-Range", "Content-Length Header missing",
    "Requested ", "Wanted range", "Header missing", "header not present",
)
#: where obstore's debug dump names the part of an answer that could not be parsed (hyper's ``Parse(...)``)
_PARSE = re.compile(r"hyper::Error\(\s*Parse\(\s*(\w+)")
#: where an obstore error names the HTTP status it got
_STATUS = re.compile(r"(?:status: |Status: |status code |HTTP status )(\d{3})")
#: the URLs an obstore error names (the request's, a redirect's): the store's text, not words about the failure
_URLS = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]*")
#: the names an obstore error quotes (URLs, and in its debug dump paths, keys, hosts in double quotes): text
#: of the store's, not obstore's words about the failure
_NAMES = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]*|\"(?:[^\"\\]|\\.)*\"")


def failure(oex: Any, exc: BaseException, root: str, url: str, options: dict[str, Any],
            conditional: bool = False) -> BaseException:
    """``exc``, met by a request for ``url`` (an object of the store at ``root``; ``options``: the client's;
    ``oex``: obstore's exceptions module), in seqstore's words: an error to raise, a :class:`Transient` to
    retry, or ``exc`` itself (not a failure of a request). ``conditional``: the request read a pinned version."""
    if isinstance(exc, FileNotFoundError):  # obstore raises the builtin for a missing object
        return not_found(exc, root, url)
    if not isinstance(exc, oex.BaseError):
        if isinstance(exc, (OSError, TimeoutError)) and not isinstance(exc, Transient):
            return Transient(f"{type(exc).__name__}: {exc}")
        return exc
    # the request was never sent: the client found no credentials (the words in a URL of a lookup, not of
    # the object: "s3://b/latest/meta-data/x" was taken for one, its 503s not retried)
    path = urlsplit(url).path.lstrip("/") or "\0"
    said = _said(exc, url)  # (the phrases below are matched here: a key holding one does not count)
    if any(h in str(exc).replace(quote(path, safe="/~"), " ").replace(path, " ") for h in _LOOKUPS):
        service = service_of(urlsplit(root).scheme.lower())
        err = _at(CredentialsError, url, f"no credentials found for {service} (none given, none in the environment, "
                  f"and the lookup of instance credentials failed: {short(exc, 160)}); {_CREDENTIALS[service]}; "
                  "for a public bucket set the storage option skip_signature=true")
        err.__cause__ = exc
        return err
    if isinstance(exc, oex.NotFoundError):
        return not_found(exc, root, url)
    if isinstance(exc, (oex.PermissionDeniedError, oex.UnauthenticatedError)):
        return _at(CredentialsError, url, f"access refused ({type(exc).__name__}); check the credentials for this "
                   "bucket (environment, storage_options or the cloud SDK's configuration)")
    if isinstance(exc, oex.PreconditionError):
        if conditional:
            return _at(StaleStoreError, url, "the object changed while the store was open (its ETag no longer "
                       "matches); reopen the store")
        return _at(ConflictError, url, "conditional write refused: the object changed")
    if isinstance(exc, oex.AlreadyExistsError):
        return _at(ConflictError, url, "already exists")
    named = _STATUS.search(str(exc))
    status = int(named.group(1)) if named else None
    # not worth another attempt; a TLS failure comes before any answer (a status), and the word must be
    # obstore's, not a bucket's or key's ("s3://b/certificates/...": its 503s were not retried)
    if status is None and "certificate" in _NAMES.sub(" ", str(exc)).lower():
        return _at(RemoteError, url, f"the server's TLS certificate was refused ({short(exc, 200)})")
    if "builder error" in said or "URL scheme is not allowed" in said:
        return _at(RemoteError, url, f"the client refused the request before sending it ({short(exc, 160)}); for "
                   "an http:// endpoint set storage_options allow_http=true (or AWS_ALLOW_HTTP=true)")
    if isinstance(exc, oex.UnknownConfigurationKeyError):
        return config_error(root, urlsplit(root).scheme.lower(), exc, options)
    if isinstance(exc, (oex.NotSupportedError, oex.InvalidPathError)):
        return _at(RemoteError, url, f"not supported by the client: {short(exc)}")
    if any(p in said for p in _REFUSALS):
        return _at(RemoteError, url, f"the client refused the request before sending it: {short(exc)}")
    if status in (401, 403):
        return _at(CredentialsError, url, f"access refused (HTTP {status}); check the credentials")
    if status == 404:
        return not_found(exc, root, url)
    if status == 412:
        return _at(StaleStoreError if conditional else ConflictError, url, "precondition failed (the object changed)")
    if status is not None and 400 <= status < 500 and status not in (408, 429):
        return _at(RemoteError, url, f"HTTP {status}: {short(exc)}")
    if "error following redirect" in said:  # retrying cannot end a loop
        return _at(RemoteError, url, "the server's redirects lead nowhere (a loop, more than the client follows, "
                   f"or to a URL it cannot ask): {short(exc, 160)}")
    parse = _PARSE.search(str(exc))  # (in the debug dump: the message says only "error sending request")
    if parse and parse.group(1) == "TooLarge":  # as the direct reader, not retried
        return _at(RemoteError, url, "the answer's headers are larger than the client takes (a server that is not "
                   "an object store, or one that misbehaves)")
    if parse:
        return Transient(f"the answer is not HTTP the client can read ({parse.group(1)}): {short(exc, 160)}",
                         answered=True)
    answered = status is not None or any(p in said for p in _ANSWERED)
    return Transient(f"{type(exc).__name__}: {short(exc)}", answered=answered)


def not_found(exc: BaseException, root: str, url: str) -> RemoteError:
    """A 404 on ``url``: :class:`BucketNotFound` where the service says the bucket (container) is
    missing, else :class:`RemoteNotFound` (a HEAD answers without a body, so it cannot tell)."""
    if any(p in _said(exc, url) for p in _NO_BUCKET):
        parts = urlsplit(root)
        named = re.search(r"<BucketName>([^<]+)</BucketName>", str(exc))
        bucket = named.group(1) if named else parts.netloc.partition("@")[0] or parts.netloc
        scheme = parts.scheme.lower()
        holder = "container" if scheme in ("az", "abfs", "abfss", "azure") else "bucket"
        return BucketNotFound(
            f"{holder} {bucket!r} does not exist ({url}); check the URL and the endpoint, or create the "
            f"{holder} first", url=url, attempts=1,
        )
    return _at(RemoteNotFound, url, "no such object")


def _said(exc: BaseException, url: str) -> str:
    """The text of ``exc`` (met by a request for ``url``) without the names in it: every URL, and the object's
    path (from the bucket on, and each tail of it after a ``/``), as it is and percent-encoded. What is left
    is the client's and the server's words about the failure: a key such as ``a/NoSuchBucket/x`` or
    ``Content-Range/x`` says nothing about it."""
    text = _URLS.sub(" ", str(exc))
    path = urlsplit(url).path.lstrip("/")
    tails = [path[i + 1 :] for i in range(len(path)) if path[i] == "/"]
    for name in sorted({path, unquote(path), *tails}, key=len, reverse=True):
        if len(name) >= 4 or name == path:  # (not a short tail: "x" would take letters out of the words)
            for form in {name, quote(name, safe="/~"), quote(name)}:
                if form:
                    text = text.replace(form, " ")
    return text


def unknown_key(url: str, service: str, key: str) -> ConfigError:
    """The error for storage option ``key`` that neither seqstore nor the ``service`` client knows."""
    valid = sorted({*_SERVICE_KEYS[service], *_CLIENT_KEYS, *SEQSTORE_OPTIONS})
    near = difflib.get_close_matches(key.lower(), valid, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return ConfigError(f"{url}: unknown storage option {key!r} for {service}{hint}; valid keys: {', '.join(valid)}")


def client_takes(key: str) -> bool:
    """Whether the client of some service takes storage option ``key``: a key of the tables above (also
    with obstore's ``aws_``/``google_``/``azure_`` prefixes, in any case), else one of obstore's other
    spellings (``endpoint_url``), asked of obstore itself where it is installed."""
    low = key.lower()
    short = next((low[len(p):] for p in ("aws_", "google_", "azure_storage_", "azure_") if low.startswith(p)), low)
    if short in _CLIENT_KEYS or any(short in keys for keys in _SERVICE_KEYS.values()):
        return True
    try:
        from obstore.store import AzureStore, GCSStore, S3Store
    except ImportError:
        return False
    makers: tuple[Any, ...] = (S3Store, GCSStore, AzureStore)  # (their configs are typed per service)
    for make in makers:
        try:
            make("b", config={key: "1"})  # (builds a client; sends nothing)
        except Exception as exc:  # noqa: BLE001 - any other refusal is about the value, not the key
            if "Configuration key" in str(exc):
                continue
        return True
    return False


def unknown_local_key(path: str, key: str) -> ConfigError:
    """The error for storage option ``key`` of the local store at ``path`` that neither seqstore nor any
    service's client knows."""
    valid = sorted({*(k for keys in _SERVICE_KEYS.values() for k in keys), *_CLIENT_KEYS, *SEQSTORE_OPTIONS})
    near = difflib.get_close_matches(key.lower(), valid, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return ConfigError(f"{path}: unknown storage option {key!r}{hint}; a local store uses verify_reads and ignores "
                       f"the others, which are for URLs; valid keys: {', '.join(valid)}")


def config_error(url: str, scheme: str, exc: BaseException, options: dict[str, Any]) -> ConfigError:
    """obstore's refusal of a client configuration in seqstore's words: an unknown key with the valid ones
    (and the nearest spelling), anything else with the URL and the client's reason."""
    service = service_of(scheme)
    text = str(exc)
    if "Configuration key" in text:
        named = re.search(r"key: '([^']*)'", text)
        return unknown_key(url, service, named.group(1) if named else ", ".join(sorted(options)))
    if "Unable to recognise URL" in text or "URL error" in text:
        return ConfigError(f"{url}: not a URL the {service} client recognises (expected {scheme}://BUCKET/PATH)")
    return ConfigError(f"{url}: the {service} client refused its configuration: {short(exc, 200)}")


def service_of(scheme: str) -> str:
    """The service a URL scheme names (``S3``, ``GCS``, ``Azure``, ``HTTP``)."""
    return {"s3": "S3", "s3a": "S3", "gs": "GCS", "gcs": "GCS", "http": "HTTP", "https": "HTTP"}.get(scheme, "Azure")


def short(exc: BaseException, most: int = 300) -> str:
    """The message of ``exc`` on one line, without obstore's ``Debug source:`` dump, cut at ``most``."""
    text = " ".join(str(exc).split("Debug source:")[0].split())
    return text if len(text) <= most else text[:most] + "..."
