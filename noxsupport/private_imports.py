"""An import-linter contract type: no package imports a private module of another.

A module is private when any part of its dotted name after the package starts with ``_``
(``rr_core._threads``, ``rr_vllm.vllm._x``); the package's front door (``__init__``) and its
public modules are what others may import. Named exceptions go in ``ignore_imports``.
"""

from __future__ import annotations

from typing import Any

from importlinter import Contract, ContractCheck, fields, output
from importlinter.application import contract_utils


def is_private(module: str) -> bool:
    return any(part.startswith("_") and part != "__init__" for part in module.split(".")[1:])


class PrivateImportsContract(Contract):
    """``packages``: the packages whose private modules only they themselves may import."""

    type_name = "private_imports"

    packages = fields.ListField(subfield=fields.StringField())
    ignore_imports = fields.SetField(subfield=fields.ImportExpressionField(), required=False)

    def check(self, graph: Any, verbose: bool) -> ContractCheck:
        contract_utils.remove_ignored_imports_and_report(
            graph=graph,
            ignore_imports=self.ignore_imports,  # type: ignore[arg-type]
            unmatched_alerting=contract_utils.AlertLevel.ERROR,
        )
        packages = set(self.packages)  # type: ignore[arg-type]
        found = []
        for importer in sorted(graph.modules):
            home = importer.split(".")[0]
            if home not in packages:
                continue
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                owner = imported.split(".")[0]
                if owner in packages and owner != home and is_private(imported):
                    lines = graph.get_import_details(importer=importer, imported=imported)
                    found.append((importer, imported, [d["line_number"] for d in lines]))
        return ContractCheck(kept=not found, metadata={"found": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, imported, lines in check.metadata["found"]:
            where = ", ".join(f"l.{n}" for n in lines)
            output.print_error(f"{importer} imports {imported}, a private module ({where})")
            output.new_line()


__all__ = ["PrivateImportsContract", "is_private"]
