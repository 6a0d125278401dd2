

def test_a_missing_model_or_seed_needs_a_reason_in_the_metadata():
    from workbench.catalogue.listing import NotebookInfo

    base = dict(stem="x", path=None, purpose="p", parameters={"smoke": False, "out_dir": ""})
    assert NotebookInfo(**base).missing_required() == ["model", "seed"]
    assert NotebookInfo(**base, absences={"model": "pure maths"}).missing_required() == ["seed"]
    assert NotebookInfo(**base, absences={"model": "", "seed": "nothing random"}).missing_required() == ["model"]
