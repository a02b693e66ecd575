"""What names a source's content in a URI: a presigned URL without its signature (pure)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# Query parameters that sign a URL rather than name the object: AWS SigV4 and Google Cloud
# Storage V4 (``X-Amz-*``, ``X-Goog-*``); AWS SigV2 and GCS V2 (only together with
# ``Signature``); an Azure shared access signature (only together with ``sig``).
_SIGNING_PREFIXES = ("x-amz-", "x-goog-")
_V2_NAMES = frozenset({"awsaccesskeyid", "signature", "expires", "googleaccessid"})
_AZURE_SAS_NAMES = frozenset(
    {"sv", "ss", "srt", "sp", "se", "st", "spr", "sig", "sr", "si", "sdd", "ses"}
    | {"skoid", "sktid", "skt", "ske", "sks", "skv", "saoid", "suoid", "scid"}
    | {"rscc", "rscd", "rsce", "rscl", "rsct"}
)


def identity_uri(uri: str) -> str:
    """``uri`` without the query parameters that sign it (a presigned S3/GCS URL, an Azure SAS),
    which change each time the URL is signed again while the object stays the same: what names a
    cache's content. Other URIs, and other query parameters, are kept as they are."""
    parts = urlsplit(uri)
    if parts.scheme.lower() not in ("http", "https") or not parts.query:
        return uri
    query = parse_qsl(parts.query, keep_blank_values=True)
    names = {name.lower() for name, _ in query}
    v2, azure = "signature" in names, "sig" in names

    def signing(name: str) -> bool:
        lower = name.lower()
        return (
            lower.startswith(_SIGNING_PREFIXES)
            or (v2 and lower in _V2_NAMES)
            or (azure and lower in _AZURE_SAS_NAMES)
        )

    kept = [(name, value) for name, value in query if not signing(name)]
    if len(kept) == len(query):
        return uri
    return urlunsplit(parts._replace(query=urlencode(kept)))
