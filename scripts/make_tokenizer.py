"""Write the shipped character tokenizer to data/tokenizer/ (run once; the result is committed)."""

from workbench.modeling.tokenizer import TOKENIZER_DIR, build_char_tokenizer

if __name__ == "__main__":
    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(str(TOKENIZER_DIR))
    print(f"wrote {TOKENIZER_DIR} ({len(tokenizer)} tokens)")
