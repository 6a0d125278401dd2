"""Round-trip catalogue notebooks to a readable percent-format script and back.

    python scripts/nbsource.py to-py notebooks/01_position_ids.ipynb > /tmp/01.py
    python scripts/nbsource.py to-ipynb /tmp/01.py notebooks/01_position_ids.ipynb

The ``.ipynb`` in ``notebooks/`` is the source of truth (committed without outputs); this tool
only makes editing a notebook's code in a text editor and reviewing it in a diff easier.
Format: ``# %% [markdown]`` / ``# %%`` / ``# %% tags=["parameters"]`` cell markers; the first
line ``# workbench: {json}`` holds the notebook's ``workbench`` metadata.
"""

import json
import sys

import nbformat

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def to_ipynb(text: str):
    lines = text.splitlines()
    meta = {}
    if lines and lines[0].startswith("# workbench:"):
        meta = json.loads(lines[0][len("# workbench:") :])
        lines = lines[1:]
    cells, current, header = [], [], None

    def flush():
        if header is None:
            return
        source = "\n".join(current).strip("\n")
        if header.startswith("# %% [markdown]"):
            body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in source.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(body))
        else:
            cell = nbformat.v4.new_code_cell(source)
            if "tags=" in header:
                cell.metadata["tags"] = json.loads(header.split("tags=", 1)[1])
            cells.append(cell)

    for line in lines:
        if line.startswith("# %%"):
            flush()
            header, current = line, []
        else:
            current.append(line)
    flush()
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = KERNELSPEC
    notebook.metadata["language_info"] = {"name": "python"}
    notebook.metadata["workbench"] = meta
    return notebook


def to_py(notebook) -> str:
    out = [f"# workbench: {json.dumps(notebook.metadata.get('workbench', {}))}"]
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            out.append("# %% [markdown]")
            out.extend(("# " + line) if line else "#" for line in cell.source.splitlines())
        else:
            tags = cell.metadata.get("tags")
            out.append("# %%" + (f" tags={json.dumps(tags)}" if tags else ""))
            out.extend(cell.source.splitlines())
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "to-ipynb":
        nb = to_ipynb(open(sys.argv[2]).read())
        nbformat.validate(nb)
        nbformat.write(nb, sys.argv[3])
    elif command == "to-py":
        print(to_py(nbformat.read(sys.argv[2], as_version=4)))
    else:
        sys.exit(__doc__)
