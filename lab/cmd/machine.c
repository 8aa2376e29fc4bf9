// servelab machine: this machine's profile (bandwidth, peak FLOP/s, ridge),
// the one lessons judge speed claims against; --remeasure measures it again.
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "lab/cmd/cli.h"
#include "lab/cmd/commands.h"
#include "lab/common/cli_args.h"
#include "lab/common/machine_profile.h"

static const char MACHINE_USAGE[] = "usage: servelab machine [--remeasure] [--threads N]\n"
                                    "\n"
                                    "Prints this machine's profile: memory bandwidth (a 64 MiB stream read with\n"
                                    "every thread) and peak FLOP/s (an fp16 matmul, and the same with 4-bit weights\n"
                                    "and 8-bit activations), each over 101 repeats: the\n"
                                    "90th percentile is the figure (other programs only ever slow a repeat; the\n"
                                    "fastest few may be clock glitches), with the 75th, median, min and max; and\n"
                                    "the ridge point (peak / bandwidth) with its band over the 75th to 90th\n"
                                    "percentiles. Lessons judge speed claims against it (lab.machine()).\n"
                                    "\n"
                                    "It is measured once and cached in $SERVELAB_CACHE_DIR, else\n"
                                    "$XDG_CACHE_HOME/servelab, else ~/.cache/servelab (machine-profile.txt), and\n"
                                    "measured again when the cache is missing, corrupt, older than 7 days, or was\n"
                                    "made for another CPU model, core count, thread count or format.\n"
                                    "\n"
                                    "  --remeasure  measure now and replace the cache (on a quiet machine)\n"
                                    "  --threads N  threads to measure with (default: one per core, as lessons)\n";

static void print_spread(const char* what, const measured_spread* s, double unit, const char* unit_name) {
    printf("%-10s %8.2f %s at the 90th percentile (75th %.2f, median %.2f, min %.2f, max %.2f)\n", what,
           s->percentile_90 / unit, unit_name, s->percentile_75 / unit, s->median / unit, s->min / unit, s->max / unit);
}

int command_machine(int argc, char** argv) {
    if (cli_answer_help(argc, argv, MACHINE_USAGE, NULL)) return 0;
    error_info err = {{0}};
    bool remeasure = false;
    int threads = 0;
    arg_cursor cursor = {argc, argv, 1, "servelab machine", NULL};
    for (; cursor.index < argc; cursor.index++) {
        bool failed = false;
        if (arg_match(&cursor, "--remeasure", false, &failed, &err)) {
            remeasure = true;
        } else if (arg_match(&cursor, "--threads", true, &failed, &err)) {
            if (!failed && parse_int_arg("--threads", cursor.value, 1, 256, &threads, &err))
                return cli_usage_error(&err);
        } else {
            arg_unknown(&cursor, &err);
            return cli_usage_error(&err);
        }
        if (failed) return cli_usage_error(&err);
    }
    machine_profile p;
    machine_profile_origin origin;
    char note[1400];
    if (machine_profile_obtain(remeasure, threads, &p, &origin, note, sizeof note, &err)) {
        fprintf(stderr, "servelab machine: %s\n", err.message);
        return 1;
    }
    if (note[0]) fprintf(stderr, "servelab machine: %s\n", note);
    char path[1024];
    error_info path_err = {{0}};
    long long age_s = (long long)time(NULL) - (long long)p.measured_at_s;
    printf("cpu        %s (%d cores online, measured on %d threads)\n", p.cpu_model, p.cores, p.threads);
    print_spread("bandwidth", &p.bandwidth_bytes_per_s, 1e9, "GB/s");
    print_spread("peak", &p.peak_flops, 1e9, "GFLOP/s");
    print_spread("peak W4A8", &p.peak_w4a8_flops, 1e9, "GFLOP/s");
    printf("ridge      %8.2f FLOP/B (%.2f to %.2f over the 75th to 90th percentiles)\n", machine_profile_ridge(&p),
           machine_profile_ridge_low(&p), machine_profile_ridge_high(&p));
    printf("measured   %lld s ago, %s\n", age_s < 0 ? 0 : age_s,
           origin == MACHINE_PROFILE_FROM_CACHE ? "read from the cache" : "just now");
    if (machine_profile_cache_path(path, sizeof path, &path_err) == 0)
        printf("cache      %s\n", path);
    else
        printf("cache      none (%s)\n", path_err.message);
    return 0;
}
