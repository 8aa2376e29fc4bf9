-- Real model shapes for the numeric drills (quiz/README.md describes the format).
--
-- Every number is copied from the model's published config.json on the
-- Hugging Face hub (num_hidden_layers, hidden_size, num_attention_heads,
-- num_key_value_heads, head_dim = hidden_size / num_attention_heads,
-- vocab_size, intermediate_size, tie_word_embeddings,
-- max_position_embeddings). The parameter count
-- the drills use is computed from these fields (lab/quiz/models.c), and
-- tests/lab/quiz/test_quiz_drills.c checks it against the published totals.
--
-- Fields:
--   name               shown in the questions
--   n_layers           transformer blocks (L)
--   d_model            width of a token's vector (hidden_size)
--   n_heads            query heads
--   n_kv_heads         key/value heads (fewer than n_heads: grouped-query attention)
--   head_dim           width of one head; n_heads * head_dim = d_model for all of these
--   vocab_size         tokens in the vocabulary (rows of the embedding and of the output matrix)
--   intermediate_size  width of the feed-forward layer (gate, up and down matrices)
--   tied_embeddings    true when the output matrix reuses the embedding matrix
--   max_position_embeddings  the context the model was trained for, in tokens: no drill
--                      asks about a longer sequence
--   source             where the numbers come from
return {
    {
        name = "Llama-2-7B",
        n_layers = 32, d_model = 4096, n_heads = 32, n_kv_heads = 32, head_dim = 128,
        vocab_size = 32000, intermediate_size = 11008, tied_embeddings = false,
        max_position_embeddings = 4096,
        source = "meta-llama/Llama-2-7b-hf config.json",
    },
    {
        name = "Llama-2-13B",
        n_layers = 40, d_model = 5120, n_heads = 40, n_kv_heads = 40, head_dim = 128,
        vocab_size = 32000, intermediate_size = 13824, tied_embeddings = false,
        max_position_embeddings = 4096,
        source = "meta-llama/Llama-2-13b-hf config.json",
    },
    {
        name = "Llama-2-70B",
        n_layers = 80, d_model = 8192, n_heads = 64, n_kv_heads = 8, head_dim = 128,
        vocab_size = 32000, intermediate_size = 28672, tied_embeddings = false,
        max_position_embeddings = 4096,
        source = "meta-llama/Llama-2-70b-hf config.json",
    },
    {
        name = "Llama-3-8B",
        n_layers = 32, d_model = 4096, n_heads = 32, n_kv_heads = 8, head_dim = 128,
        vocab_size = 128256, intermediate_size = 14336, tied_embeddings = false,
        max_position_embeddings = 8192,
        source = "meta-llama/Meta-Llama-3-8B config.json",
    },
    {
        name = "Mistral-7B",
        n_layers = 32, d_model = 4096, n_heads = 32, n_kv_heads = 8, head_dim = 128,
        vocab_size = 32000, intermediate_size = 14336, tied_embeddings = false,
        max_position_embeddings = 32768,
        source = "mistralai/Mistral-7B-v0.1 config.json",
    },
    {
        name = "Qwen2.5-7B",
        n_layers = 28, d_model = 3584, n_heads = 28, n_kv_heads = 4, head_dim = 128,
        vocab_size = 152064, intermediate_size = 18944, tied_embeddings = false,
        max_position_embeddings = 131072,
        source = "Qwen/Qwen2.5-7B config.json",
    },
}
