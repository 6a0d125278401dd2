"""The catalogue's listing: required parameters and their declared absences, what a read gives, and a file that is not a notebook."""

import re

import pytest


def test_a_missing_model_or_seed_needs_a_reason_in_the_metadata():
    from workbench.catalogue.listing import NotebookInfo

    base = dict(stem="x", path=None, purpose="p", parameters={"smoke": False, "out_dir": ""})
    assert NotebookInfo(**base).missing_required() == ["model", "seed"]
    assert NotebookInfo(**base, absences={"model": "pure maths"}).missing_required() == ["seed"]
    assert NotebookInfo(**base, absences={"model": "", "seed": "nothing random"}).missing_required() == ["model"]


def test_the_listing_reads_what_nbformat_reads_without_importing_torch_or_nbformat():
    """``workbench list`` answers in a fraction of a second: reading the catalogue imports neither torch nor nbformat
    (its jsonschema builds a grammar at import), and the notebooks' JSON read directly gives nbformat's values."""
    import subprocess
    import sys

    import nbformat

    from workbench.catalogue.listing import catalogue, parameters_cell_source, parse_parameters

    probe = ("import sys, workbench.catalogue.listing as l; l.catalogue(); "
             "print([m for m in ('torch', 'nbformat', 'jsonschema', 'transformers') if m in sys.modules])")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", loaded
    infos = catalogue()
    assert len(infos) > 30
    for info in infos:
        node = nbformat.read(str(info.path), as_version=4)
        assert info.parameters == parse_parameters(parameters_cell_source(node)), info.stem
        meta = node.metadata.get("workbench", {})
        assert (info.purpose, info.smoke_parameters, info.main_figure) == (
            meta.get("purpose", ""), dict(meta.get("smoke_parameters", {})), meta.get("main_figure")), info.stem


@pytest.mark.parametrize("content, problem", [("{not json", "cannot be read as a notebook"),
                                              ('{"nbformat": 3, "worksheets": []}', "not a Jupyter notebook in format 4")])
def test_a_file_that_is_not_a_notebook_is_named_in_the_error(tmp_path, content, problem):
    from workbench.catalogue.listing import read_notebook_info
    from workbench.core.errors import ParameterError

    path = tmp_path / "broken.ipynb"
    path.write_text(content)
    with pytest.raises(ParameterError, match=re.escape(f"{path}: {problem}")):
        read_notebook_info(path)
