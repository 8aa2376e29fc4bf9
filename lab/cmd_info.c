// servelab info: what this build supports.
#include <stdio.h>
#include <string.h>

#include "engine/model_synth.h"
#include "kernels/cuda/cuda_info.h"
#include "lab/commands.h"

int command_info(int argc, char** argv) {
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        puts("usage: servelab info\n\nPrints the build's backends and the synthetic presets.");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "servelab info: unknown option '%s'\n", argv[1]);
        return 2;
    }
    char cuda_message[256];
    int n_devices = cuda_device_count(cuda_message, sizeof cuda_message);
    printf("backends: cpu (scalar fp32 math; fp32, fp16, q8_0 weights)\n");
    printf("cuda: %s, %d device(s): %s\n", cuda_backend_built() ? "built" : "not built", n_devices, cuda_message);
    printf("synthetic presets:\n");
    for (const synth_preset* p = synth_presets(); p->name; p++) printf("  %-7s %s\n", p->name, p->summary);
    return 0;
}
