"""The CLI's tables align titles in any script: a CJK character takes two terminal columns."""

from kb_rerank.cli.common import display_width, fit


def test_wide_characters_count_two_columns_and_cells_pad_to_the_same_width():
    assert display_width("abc") == 3 and display_width("請求書") == 6 and display_width("e\u0301") == 1
    cells = [fit(t, 10) for t in ("Invoices", "請求書の発行方法について", "Rechnungsübersicht", "发票")]
    assert {display_width(c) for c in cells} == {10}
    assert cells[1] == "請求書の発" and cells[3] == "发票      "
    assert fit("請求", 3) == "請 "  # a wide character that would cross the edge is left out
