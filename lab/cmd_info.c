// servelab info: what this build supports.
#include <stdio.h>
#include <string.h>

#include "engine/fault.h"
#include "engine/model_synth.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cuda/cuda_info.h"
#include "lab/commands.h"

int command_info(int argc, char** argv) {
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        puts("usage: servelab info [--faults]\n\nPrints what this build runs on this CPU (SIMD kernels, weight and KV formats,\nCUDA) and the synthetic presets.\n"
             "--faults lists the deliberate bugs --fault NAME can start the engine with, a line\neach saying what breaks.");
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "--faults") == 0) {
        printf("faults (--fault NAME[,NAME] on lab, sim, generate and lesson run; breaks_with in lab.check):\n");
        for (int id = 0; id < FAULT_COUNT; id++) printf("  %-24s %s\n", fault_name(id), fault_description(id));
        return 0;
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
           "(--quant w8a16, w4a16, w8a8)\n");
    printf("KV cache: fp16, fp32, int8 (--kv-dtype; generate defaults to fp32, sim to fp16)\n");
    printf("cuda: %s, %d device(s): %s\n", cuda_backend_built() ? "built" : "not built", n_devices, cuda_message);
    printf("synthetic presets (random weights: the shapes of real models, not their knowledge):\n");
    for (const synth_preset* p = synth_presets(); p->name; p++) printf("  %-7s %s\n", p->name, p->summary);
    return 0;
}
