"""The vocabulary's special token ids (docs/design.md section 4), defined here and nowhere else.

GPT-2 BPE has 50257 ids, the last of which is ``<|endoftext|>``; the model adds
``<predict>`` right after it and pads the vocabulary to a multiple of 64, whose
last id serves as the padding token.
"""

EOS_ID = 50256       # <|endoftext|>: ends a document
TEXT_VOCAB = EOS_ID + 1  # GPT-2's ids, EOS included: everything a tokenizer or a sampler may emit
PREDICT_ID = 50257   # <predict>: the input of every predict slot
VOCAB_SIZE = 50304   # the model's embedding rows (50258 rounded up to a multiple of 64)
PAD_ID = VOCAB_SIZE - 1  # left padding at evaluation and generation; each pad is its own document
