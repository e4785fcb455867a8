"""The GSM8K cases on which `rule_mode=verl` is compared with verl's own scorer.

Each case is (id, response, ground truth). `tools/record_verl_gsm8k.py` runs verl's
`verl/utils/reward_score/gsm8k.py` itself on every case (both methods, two format scores) and writes
`gsm8k_verl_recorded.json` beside this file; `test_gsm8k_verl_parity.py` checks quartet's rule and an
independent reimplementation against that record. The hard cases are the ones where a reader of verl's
rule would guess wrong: the `####` before the 300-character window or cut by it, several markers, signs,
decimals, commas, `$`, trailing dots, no or other whitespace after `####`, non-ASCII minus and digits.
"""

from __future__ import annotations

from typing import Any

FILLER = " and so on"  # 10 characters, no digit, no '#', no '-'

CASES: list[tuple[str, str, Any]] = [
    ("plain", "The answer is\n#### 42", "42"),
    ("gsm8k_style", "Natalia sold 48/2 = 24 clips in May.\nAltogether 48+24 = 72 clips.\n#### 72", "72"),
    ("wrong_number", "#### 41", "42"),
    ("no_space", "so ####42", "42"),
    ("two_spaces", "so ####  42", "42"),
    ("newline_after", "so ####\n42", "42"),
    ("tab_after", "so ####\t42", "42"),
    ("nbsp_after", "so ####\u00a042", "42"),
    ("five_hashes", "so ##### 42", "42"),
    ("three_hashes", "so ### 42", "42"),
    ("thousands_comma", "#### 1,000", "1000"),
    ("odd_commas", "#### 1,00,0", "1000"),
    ("leading_comma", "#### ,5", "5"),
    ("dollar_before", "#### $42", "42"),
    ("dollar_after", "#### 42$", "42"),
    ("decimal_zero", "#### 18.0", "18"),
    ("decimal_exact", "#### 0.25", "0.25"),
    ("decimal_no_lead", "#### .5", "0.5"),
    ("decimal_comma", "#### 1,234.56", "1234.56"),
    ("two_dots", "#### 1.2.3", "1.2.3"),
    ("trailing_dot", "#### 18.", "18"),
    ("trailing_dot_sentence", "#### 18. That is all.", "18"),
    ("dot_alone", "#### .", "."),
    ("negative", "#### -3", "-3"),
    ("negative_decimal", "#### -0.5", "-0.5"),
    ("double_minus", "#### --3", "-3"),
    ("minus_dot", "#### -.", "-."),
    ("plus_sign", "#### +42", "42"),
    ("unicode_minus", "#### \u22123", "-3"),
    ("en_dash_minus", "#### \u20133", "-3"),
    ("fullwidth_digits", "#### \uff14\uff12", "42"),
    ("arabic_indic_digits", "#### \u0664\u0662", "42"),
    ("percent", "#### 42%", "42"),
    ("fraction", "#### 3/4", "3/4"),
    ("exponent", "#### 1e3", "1000"),
    ("space_in_number", "#### 4 2", "42"),
    ("special_token_after", "#### 42<|im_end|>", "42"),
    ("crlf_after", "#### 42\r\n", "42"),
    ("two_markers_last_right", "first #### 7 then #### 42", "42"),
    ("two_markers_first_right", "first #### 42 then #### 7", "42"),
    ("last_marker_malformed", "#### 42 then ####43", "42"),
    ("last_marker_no_number", "#### 42 then #### none", "42"),
    ("marker_then_later_numbers", "#### 42 and 43 more", "42"),
    ("marker_before_window", "#### 42" + FILLER * 30, "42"),
    ("marker_cut_by_window", "#### 42" + "y" * 294, "42"),
    ("marker_fits_window", "#### 42" + "y" * 293, "42"),
    ("number_cut_by_window", "#### 12345" + "y" * 292, "2345"),
    ("old_marker_out_new_in", "#### 7" + FILLER * 40 + " #### 42", "42"),
    ("long_answer_at_end", "Let me think." + FILLER * 1000 + "\n#### 42", "42"),
    ("long_answer_at_start", "#### 42\n" + FILLER * 1000, "42"),
    ("very_long_digits_before", "1" * 5000 + " #### 42", "42"),
    ("boxed_only", "The answer is \\boxed{42}.", "42"),
    ("empty", "", "42"),
    ("flexible_commas_kept", "total 1,000 .", "1000"),
    ("flexible_only_dots", "no digits . at all .", "."),
    ("flexible_minus_alone", "a - b", "-"),
    ("flexible_last_number", "#### 9 and then 10", "10"),
    ("truth_whole_solution", "#### 42", "48 + 24 = 72\n#### 42"),
    ("truth_with_space", "#### 42", "42 "),
    ("truth_int", "#### 42", 42),
]
"""(id, response, ground truth): ids unique; the ground truth as a data row would carry it."""
