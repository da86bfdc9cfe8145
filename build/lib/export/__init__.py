"""ONNX export of fine-tuned checkpoints into self-describing model bundles.

Importing this package (or `export.bundle`) never imports torch: the serving side reads
bundles with onnxruntime, tokenizers and numpy only. `export_bundle` resolves lazily.
"""

from .bundle import (
    BundleError,
    BundleManifest,
    VariantInfo,
    load_bundle_manifest,
    verify_bundle_files,
)

__all__ = [
    "BundleError",
    "BundleManifest",
    "VariantInfo",
    "load_bundle_manifest",
    "verify_bundle_files",
    "export_bundle",
    "ExportError",
    "VerificationError",
]


def __getattr__(name: str):
    if name in ("export_bundle", "ExportError", "VerificationError"):
        from . import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'export' has no attribute {name!r}")
