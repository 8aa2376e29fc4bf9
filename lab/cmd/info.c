// servelab info: what this build supports.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat_template.h"
#include "engine/fault.h"
#include "engine/gguf.h"
#include "engine/gguf_model.h"
#include "engine/gguf_vocab.h"
#include "engine/kv_memory.h"
#include "engine/model_synth.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cuda/cuda_info.h"
#include "lab/cmd/commands.h"
#include "lab/common/cli_args.h"
#include "lab/common/model_source.h"

// ---- servelab info FILE.gguf -----------------------------------------------------------------

static void print_tensor_types(const gguf_model_info* info) {
    printf("tensor types:%s", info->tensor_data_bytes == 0 ? " none" : "");
    for (int type = 0; type < 32; type++)
        if (info->tensor_type_counts[type] > 0)
            printf(" %s x%d", gguf_tensor_type_name((gguf_tensor_type)type), info->tensor_type_counts[type]);
    printf(" (%llu bytes of tensor data)\n", (unsigned long long)info->tensor_data_bytes);
}

// What the loader made of each kind of matrix (the first layer's stand for all).
static void print_loaded_as(const model* m) {
    printf("loaded as: embedding %s, layer matrices %s, classifier %s%s\n",
           weight_dtype_name(m->token_embedding.dtype), weight_dtype_name(m->layers[0].wq.dtype),
           weight_dtype_name(m->classifier.dtype),
           m->config.shared_classifier ? " (tied to the embedding)" : " (its own output.weight)");
    const weight_matrix* w = &m->layers[0].wq;
    if (w->dtype == WEIGHT_I8 || w->dtype == WEIGHT_I4)
        printf("  %s symmetric, group %d, fp16 scale per group: the kernels' %s, the file's codes and scales\n",
               weight_dtype_name(w->dtype), w->group_size, w->dtype == WEIGHT_I8 ? "W8A16" : "W4A16");
}

static int describe_gguf(const char* path) {
    gguf_file f;
    error_info err = {{0}};
    if (gguf_open(&f, path, &err)) {
        fprintf(stderr, "servelab info: %s\n", err.message);
        return 1;
    }
    printf("file: %s (GGUF v%u, %zu bytes, %d tensors, %d metadata keys, alignment %llu)\n", path, f.version, f.size,
           f.n_tensors, f.n_kv, (unsigned long long)f.alignment);
    gguf_model_info info;
    int status = gguf_model_read_info(&f, &info, &err);
    if (info.architecture[0]) printf("architecture: %s%s%s\n", info.architecture, info.model_name[0] ? ", name " : "",
                                     info.model_name);
    print_tensor_types(&info);
    error_info tok_err = {{0}};
    gguf_string template_text = gguf_kv_string(gguf_find_kv(&f, "tokenizer.chat_template"));
    char* template_copy = template_text.length > 0 ? strndup(template_text.bytes, (size_t)template_text.length) : NULL;
    chat_template_kind chat = chat_template_recognise(template_copy);
    free(template_copy);
    tokenizer* t = NULL;
    if (tok_from_gguf(&t, &f, &tok_err) == 0) {
        printf("tokenizer: %s, %d tokens, BOS %d, EOS %d, %s BOS\n", tok_kind(t), tok_vocab_size(t),
               (int)tok_bos_id(t), (int)tok_eos_id(t), tok_adds_bos(t) ? "adds" : "does not add");
        tok_free(t);
    } else {
        printf("tokenizer: none usable: %s\n", tok_err.message);
    }
    if (template_text.length == 0) printf("chat template: none in the file\n");
    else if (chat == CHAT_TEMPLATE_NONE)
        printf("chat template: %llu bytes, not one servelab recognises (Llama 3, ChatML, Llama 2 [INST], Zephyr)\n",
               (unsigned long long)template_text.length);
    else printf("chat template: %s (recognised; generate --chat uses it)\n", chat_template_name(chat));
    if (status) {
        printf("not loadable: %s\n", err.message);
        gguf_close(&f);
        return 1;
    }
    const model_config* c = &info.config;
    printf("shapes: dim %d, hidden %d, layers %d, heads %d, KV heads %d (%s), head_dim %d, vocab %d, context %d\n",
           c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
           c->n_kv_heads == c->n_heads ? "multi-head" : c->n_kv_heads == 1 ? "multi-query" : "grouped-query",
           c->head_dim, c->vocab_size, info.file_context_length);
    printf("rope: base %g, %d of %d dims, %s; rmsnorm epsilon %g\n", info.rope_base, info.rope_dimensions, c->head_dim,
           c->rope_neox ? "NEOX pairs (i, i + dims/2)" : "adjacent pairs", info.rms_epsilon);
    model m;
    gguf_model_options options = {MODEL_DTYPE_DEFAULT, 0, false};
    status = gguf_model_from_file(&m, &f, &options, &err);
    gguf_close(&f);
    if (status) {
        printf("not loadable: %s\n", err.message);
        return 1;
    }
    print_loaded_as(&m);
    printf("weights: %.2fM parameters, %llu bytes; a decode step reads %llu weight bytes per token\n",
           (double)m.n_parameters / 1e6, (unsigned long long)m.weight_bytes,
           (unsigned long long)model_decode_weight_bytes(&m));
    printf("KV cache per token: fp32 %llu bytes, fp16 %llu, int8 %llu (2 x %d layers x %d KV heads x %d dims)\n",
           (unsigned long long)kv_memory_block_bytes(&m.config, KV_F32, 1),
           (unsigned long long)kv_memory_block_bytes(&m.config, KV_F16, 1),
           (unsigned long long)kv_memory_block_bytes(&m.config, KV_I8, 1), m.config.n_layers, m.config.n_kv_heads,
           m.config.head_dim);
    model_free(&m);
    return 0;
}

int command_info(int argc, char** argv) {
    if (argc > 1 && arg_is_help(argv[1])) {
        puts("usage: servelab info [--faults | FILE.gguf]\n\nFILE.gguf: the architecture, shapes, tensor types, how each is loaded, the weight\nbytes a decode step reads per token and the KV cache bytes per token.\n\nWithout a file: prints what this build runs on this CPU (SIMD kernels, weight and KV formats,\nCUDA) and the synthetic presets.\n"
             "--faults lists the deliberate bugs --fault NAME can start the engine with, a line\neach saying what breaks.");
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "--faults") == 0) {
        printf("faults (--fault NAME[,NAME] on lab, sim, generate and lesson run; breaks_with in lab.check):\n");
        for (int id = 0; id < FAULT_COUNT; id++) printf("  %-24s %s\n", fault_name(id), fault_description(id));
        return 0;
    }
    if (argc == 2 && argv[1][0] != '-') {
        if (!model_source_is_gguf(argv[1])) {
            fprintf(stderr, "servelab info: %s: not a GGUF file (expected the magic \"GGUF\")\n", argv[1]);
            return 1;
        }
        return describe_gguf(argv[1]);
    }
    if (argc > 1) {
        fprintf(stderr, "servelab info: unknown option '%s'\n", argv[1]);
        return 2;
    }
    char cuda_message[256];
    int n_devices = cuda_device_count(cuda_message, sizeof cuda_message);
    // What the kernels will actually run: the level is chosen at run time
    // (kernels/cpu/cpu_features.h), so it is this CPU's, not the build's.
    const cpu_features* f = cpu_features_get();
    cpu_simd_level level = f->selected;
    char extras[64] = "";
    if (level == CPU_SIMD_AVX512 && (f->avx512vnni || f->avx512bf16))
        snprintf(extras, sizeof extras, " with %s%s%s", f->avx512vnni ? "VNNI (int8 dot products)" : "",
                 f->avx512vnni && f->avx512bf16 ? " and " : "", f->avx512bf16 ? "BF16" : "");
    printf("backends: cpu, %s kernels%s on this CPU (%s)\n", cpu_simd_level_name(level), extras,
           level == CPU_SIMD_SCALAR ? "plain C, no SIMD" : level == CPU_SIMD_AVX2 ? "8 fp32 lanes" : "16 fp32 lanes");
    if (level < f->best)
        printf("  lowered by SERVELAB_SIMD from %s, the best this CPU has\n", cpu_simd_level_name(f->best));
    if (f->env_ignored) printf("  SERVELAB_SIMD was set but not understood (scalar, avx2, avx512): ignored\n");
    // Every weight_dtype the matmul kernels take (kernels/cpu/matmul.h).
    printf("weights: fp32, fp16 (presets and llama2.c files), q8_0 (llama2.c export v2), int8 and int4 "
           "(--quant w8a16, w4a16, w8a8, w4a8)\n");
    printf("GGUF (--model FILE.gguf, info FILE.gguf): architectures llama, qwen2; F32, F16, BF16, Q8_0 (as W8A8 g32), "
           "Q4_0 (as W4A8 g32), Q4_K/Q5_K/Q6_K (converted to int8); tokenizers llama (SentencePiece), gpt2 "
           "(byte-level BPE)\n");
    printf("KV cache: fp16, fp32, int8 (--kv-dtype; generate defaults to fp32, sim to fp16)\n");
    printf("cuda: %s, %d device(s): %s\n", cuda_backend_built() ? "built" : "not built", n_devices, cuda_message);
    printf("synthetic presets (random weights: the shapes of real models, not their knowledge):\n");
    for (const synth_preset* p = synth_presets(); p->name; p++) printf("  %-7s %s\n", p->name, p->summary);
    return 0;
}
