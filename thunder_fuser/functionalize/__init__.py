from thunder_fuser.functionalize.functionalize import AliasError, functionalize, storage_roots

__all__ = ["AliasError", "functionalize", "storage_roots"]
