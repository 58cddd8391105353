/*
 * An emulated libnvidia-ml.so.1: the MIG subset of NVML that mig_batch and common MIG tools call,
 * with NVML's C ABI (struct layouts, versioned structs) and its return codes, so that nvidia-ml-py's
 * pynvml runs unmodified against it.
 *
 * One emulated node is a directory named by $MIG_BATCH_NVML_EMU_DIR:
 *   gpus     the GPUs and their MIG profile tables (tab-separated text written by
 *            mig_batch.gpu.nvml_emu from etc/gpus; read-only here)
 *   state    the GPU and compute instances now (rewritten under the lock, atomically by rename)
 *   lock     flock(2) target: every call that reads or changes instances holds it, so that the
 *            Prolog, the Epilog and any other process see one node
 *   history  one JSON line per create/destroy, appended under the lock (the tests' audit)
 *   capabilities/gpu<N>/mig/gi<G>[/ci<C>]/access
 *            each live GPU and compute instance's capability, as the driver keeps it under
 *            /proc/driver/nvidia/capabilities: the minor of its /dev/nvidia-caps/nvidia-cap<minor>
 *            node, made when the instance is made and removed when it is destroyed (MIG user guide,
 *            "Device Nodes and Capabilities"); minors laid out as the driver's mig-minors list
 *   usage    what runs on the MIG devices (written by the test harness, mig_batch.gpu.nvml_emu's
 *            attach() and replay(), under the lock): "attach <MIG-uuid> <pid>" lines (a compute
 *            instance is IN_USE while such a pid lives; nvmlDeviceGetComputeRunningProcesses lists
 *            it) and "replay <MIG-uuid> <t0> <s>:<MiB>,..." lines (the device's memory in use,
 *            nvmlDeviceGetMemoryInfo, follows that trajectory from epoch time t0)
 *
 * Stricter than the driver in one way: pointers passed in are checked to be readable memory
 * (NVML_ERROR_INVALID_ARGUMENT if not), so that a wrong ctypes argument shape (a struct passed by
 * value where NVML takes a pointer) fails as an NVML error instead of crashing the test process.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64 /* the throughput bench emulates 48 per node */
#define MAX_PROFILES 24
#define MAX_STARTS 16
#define MAX_GI 32 /* GPU instance ids 1..MAX_GI-1 */
#define MAX_CI 8  /* compute instance ids 0..MAX_CI-1 */
#define NAME_LEN 96
#define UUID_LEN 96

/* ---- NVML's public types (layouts as in nvml.h / pynvml) ---- */
typedef struct { unsigned int start, size; } nvmlGpuInstancePlacement_t;
typedef struct { unsigned int start, size; } nvmlComputeInstancePlacement_t;
typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;
typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[NAME_LEN];
} nvmlGpuInstanceProfileInfo_v2_t;
typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, copyEngineCount, decoderCount,
        encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[NAME_LEN];
    unsigned int capabilities;
} nvmlGpuInstanceProfileInfo_v3_t;
typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;
typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[NAME_LEN];
} nvmlComputeInstanceProfileInfo_v2_t;
typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[NAME_LEN];
    unsigned int capabilities;
} nvmlComputeInstanceProfileInfo_v3_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; }
    nvmlProcessInfo_v2_t; /* also the _v3 call's layout */

/* NVML_STRUCT_VERSION(type, n) = sizeof(type) | n << 24 */
#define STRUCT_VERSION(type, n) ((unsigned int)(sizeof(type) | ((n) << 24)))

/* Handles are pointers into these static tables: stable for the life of the process, and a
 * pointer outside them is recognisably not a handle. */
typedef struct emu_device { int gpu; int gi; int ci; } *nvmlDevice_t; /* gi < 0: the full GPU */
typedef struct emu_gpu_instance { int gpu; int gi; } *nvmlGpuInstance_t;
typedef struct emu_compute_instance { int gpu; int gi; int ci; } *nvmlComputeInstance_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;
typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

static struct emu_device full_gpus[MAX_GPUS];
static struct emu_device mig_devices[MAX_GPUS][MAX_GI][MAX_CI];
static struct emu_gpu_instance gi_handles[MAX_GPUS][MAX_GI];
static struct emu_compute_instance ci_handles[MAX_GPUS][MAX_GI][MAX_CI];

/* ---- the node's table (file "gpus") ---- */
struct profile {
    unsigned int enum_value, id, compute_slices, instance_count, memory_mib, sms, copy_engines, decoders,
        encoders, jpegs, ofas, memory_slices, n_starts;
    unsigned int starts[MAX_STARTS];
    char name[NAME_LEN]; /* NVML's name, e.g. "MIG 1g.10gb" */
};
struct gpu {
    char name[NAME_LEN], uuid[UUID_LEN];
    unsigned int memory_mib, mig_mode, memory_slices, compute_slices, n_profiles;
    struct profile profiles[MAX_PROFILES];
};
static struct gpu gpus[MAX_GPUS];
static unsigned int n_gpus;
static char node_dir[4096], node_name[256];
static int init_count;

/* ---- the node's instances (file "state") ---- */
struct ci_state { int used; unsigned int profile_id, slices, start; char uuid[UUID_LEN]; };
struct gi_state { int used; unsigned int profile_id, start, size; unsigned long long serial; struct ci_state ci[MAX_CI]; };
static struct gi_state state[MAX_GPUS][MAX_GI];
static unsigned long long next_serial;
static int lock_fd = -1;

static const char *error_strings[] = {
    [0] = "Success", [1] = "Uninitialized", [2] = "Invalid Argument", [3] = "Not Supported",
    [4] = "Insufficient Permissions", [5] = "Already Initialized", [6] = "Not Found",
    [7] = "Insufficient Size", [9] = "Driver Not Loaded", [13] = "Function Not Found",
    [19] = "In use by another client", [23] = "Insufficient resources",
    [25] = "Argument version mismatch",
};

const char *nvmlErrorString(nvmlReturn_t result) {
    if (result >= 0 && result < (int)(sizeof error_strings / sizeof *error_strings) && error_strings[result])
        return error_strings[result];
    return "Unknown Error";
}

static void complain(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "emulated libnvidia-ml: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* True when [p, p+n) is readable: write(2) into a pipe copies from it and fails with EFAULT if not. */
static int readable(const void *p, size_t n) {
    int fds[2];
    if (!p) return 0;
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return 1; /* cannot check: trust the caller */
    ssize_t wrote = write(fds[1], p, n);
    close(fds[0]);
    close(fds[1]);
    return wrote == (ssize_t)n;
}
#define REQUIRE_POINTER(p) do { if (!readable((p), sizeof *(p))) return NVML_ERROR_INVALID_ARGUMENT; } while (0)

/* ---- loading the table ---- */
static int split_tabs(char *line, char **fields, int max) {
    int n = 0;
    line[strcspn(line, "\n")] = 0;
    for (char *p = line; n < max;) {
        fields[n++] = p;
        char *tab = strchr(p, '\t');
        if (!tab) break;
        *tab = 0;
        p = tab + 1;
    }
    return n;
}

static int load_table(void) {
    char path[4200];
    snprintf(path, sizeof path, "%s/gpus", node_dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        complain("cannot read %s: %s", path, strerror(errno));
        return 0;
    }
    char line[1024], *fields[32];
    n_gpus = 0;
    memset(gpus, 0, sizeof gpus);
    snprintf(node_name, sizeof node_name, "node");
    int ok = 1;
    while (ok && fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        int n = split_tabs(line, fields, 32);
        if (!strcmp(fields[0], "node") && n == 2) {
            snprintf(node_name, sizeof node_name, "%s", fields[1]);
        } else if (!strcmp(fields[0], "gpu") && n == 8 && n_gpus < MAX_GPUS) {
            struct gpu *g = &gpus[n_gpus++];
            snprintf(g->name, NAME_LEN, "%s", fields[2]);
            snprintf(g->uuid, UUID_LEN, "%s", fields[3]);
            g->memory_mib = strtoul(fields[4], 0, 10);
            g->mig_mode = strtoul(fields[5], 0, 10);
            g->memory_slices = strtoul(fields[6], 0, 10);
            g->compute_slices = strtoul(fields[7], 0, 10);
        } else if (!strcmp(fields[0], "profile") && n == 15 && n_gpus > 0) {
            struct gpu *g = &gpus[n_gpus - 1];
            if (g->n_profiles == MAX_PROFILES) { ok = 0; break; }
            struct profile *p = &g->profiles[g->n_profiles++];
            unsigned int *numbers[] = {&p->enum_value, &p->id, &p->compute_slices, &p->instance_count,
                                       &p->memory_mib, &p->sms, &p->copy_engines, &p->decoders, &p->encoders,
                                       &p->jpegs, &p->ofas, &p->memory_slices};
            for (int k = 0; k < 12; k++) *numbers[k] = strtoul(fields[1 + k], 0, 10);
            for (char *s = strtok(fields[13], ","); s && p->n_starts < MAX_STARTS; s = strtok(0, ","))
                p->starts[p->n_starts++] = strtoul(s, 0, 10);
            snprintf(p->name, NAME_LEN, "%s", fields[14]);
        } else {
            ok = 0;
        }
    }
    fclose(f);
    if (!ok) complain("%s: a line is malformed or over the limits (%d GPUs, %d profiles)", path, MAX_GPUS, MAX_PROFILES);
    return ok;
}

/* ---- state: lock, load, save ---- */
static int lock_node(int exclusive) {
    char path[4200];
    snprintf(path, sizeof path, "%s/lock", node_dir);
    lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd < 0) lock_fd = open(path, O_RDONLY | O_CLOEXEC); /* a non-root reader */
    if (lock_fd < 0) return 0;
    while (flock(lock_fd, exclusive ? LOCK_EX : LOCK_SH) != 0)
        if (errno != EINTR) return 0;
    return 1;
}

static void unlock_node(void) {
    if (lock_fd >= 0) close(lock_fd); /* closing releases the flock */
    lock_fd = -1;
}

/* The state parsed last and the token of the save it came from: every save writes a fresh random token on
 * the first line, so a call reads one line, not the whole file, when no process changed the node since. */
static unsigned long long loaded_token;
static int loaded_valid;

static unsigned long long fresh_token(void) {
    struct timespec now;
    static unsigned long long counter;
    clock_gettime(CLOCK_REALTIME, &now);
    unsigned long long x = ((unsigned long long)now.tv_sec << 30) ^ (unsigned long long)now.tv_nsec ^
                           ((unsigned long long)getpid() << 40) ^ (++counter << 20);
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; /* mix: tokens of two processes never line up */
    return x ? x : 1;
}

static void load_state(int fresh) {
    char path[4200], line[512];
    snprintf(path, sizeof path, "%s/state", node_dir);
    FILE *f = fopen(path, "r");
    unsigned long long serial = 1, token = 0;
    if (f && fgets(line, sizeof line, f) && sscanf(line, "serial %llu %llu", &serial, &token) == 2 && !fresh &&
        loaded_valid && token == loaded_token) {
        fclose(f);
        return; /* unchanged since this process parsed it */
    }
    memset(state, 0, sizeof state);
    next_serial = serial;
    loaded_valid = 0; /* until the whole file is parsed */
    if (!f) return; /* no instances yet */
    while (fgets(line, sizeof line, f)) {
        unsigned int g, gi, ci, a, b, c;
        unsigned long long serial;
        char uuid[UUID_LEN];
        if (sscanf(line, "gi %u %u %u %u %u %llu", &g, &gi, &a, &b, &c, &serial) == 6 && g < MAX_GPUS &&
                   gi < MAX_GI) {
            state[g][gi] = (struct gi_state){.used = 1, .profile_id = a, .start = b, .size = c, .serial = serial};
        } else if (sscanf(line, "ci %u %u %u %u %u %u %95s", &g, &gi, &ci, &a, &b, &c, uuid) == 7 && g < MAX_GPUS &&
                   gi < MAX_GI && ci < MAX_CI) {
            struct ci_state *s = &state[g][gi].ci[ci];
            *s = (struct ci_state){.used = 1, .profile_id = a, .slices = b, .start = c};
            snprintf(s->uuid, UUID_LEN, "%s", uuid);
        }
    }
    fclose(f);
    loaded_token = token, loaded_valid = token != 0;
}

static int save_state(void) {
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/state", node_dir);
    snprintf(tmp, sizeof tmp, "%s/state.tmp", node_dir);
    FILE *f = fopen(tmp, "w");
    loaded_valid = 0; /* until this save is whole */
    if (!f) return 0;
    unsigned long long token = fresh_token();
    fprintf(f, "serial %llu %llu\n", next_serial, token);
    for (unsigned int g = 0; g < n_gpus; g++)
        for (int gi = 0; gi < MAX_GI; gi++) {
            struct gi_state *s = &state[g][gi];
            if (!s->used) continue;
            fprintf(f, "gi %u %d %u %u %u %llu\n", g, gi, s->profile_id, s->start, s->size, s->serial);
            for (int ci = 0; ci < MAX_CI; ci++)
                if (s->ci[ci].used)
                    fprintf(f, "ci %u %d %d %u %u %u %s\n", g, gi, ci, s->ci[ci].profile_id, s->ci[ci].slices,
                            s->ci[ci].start, s->ci[ci].uuid);
        }
    /* no fsync: a killed process leaves the old or the new state (rename), and a real GPU's instances do
     * not outlive a power loss either */
    int ok = fflush(f) == 0;
    ok = (fclose(f) == 0) && ok && rename(tmp, path) == 0;
    if (ok) loaded_token = token, loaded_valid = 1;
    return ok;
}

static void log_event(const char *op, unsigned int g, int gi, int ci, const char *profile, unsigned int start,
                      unsigned int size, const char *uuid) {
    char path[4200];
    struct timeval now;
    gettimeofday(&now, 0);
    snprintf(path, sizeof path, "%s/history", node_dir);
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f,
            "{\"time\": %ld.%06ld, \"node\": \"%s\", \"op\": \"%s\", \"gpu\": %u, \"gi_id\": %d, \"ci_id\": %d, "
            "\"profile\": \"%s\", \"start\": %u, \"size\": %u, \"uuid\": \"%s\", \"pid\": %d}\n",
            (long)now.tv_sec, (long)now.tv_usec, node_name, op, g, gi, ci, profile, start, size, uuid, (int)getpid());
    fclose(f);
}

/* ---- what runs on the MIG devices (file "usage"; read with the lock held) ---- */
#define MAX_ATTACHED 512
#define MAX_REPLAYS 128
#define MAX_POINTS 256
struct attached { char uuid[UUID_LEN]; int pid; };
struct replay { char uuid[UUID_LEN]; double t0; unsigned int n; double seconds[MAX_POINTS], mib[MAX_POINTS]; };
static struct attached attached[MAX_ATTACHED];
static struct replay replays[MAX_REPLAYS];
static unsigned int n_attached, n_replays;

/* ---- capabilities: what a process must open to use an instance (the driver's proc files) ---- */
#define CAPS_GI_PER_GPU 15 /* the driver's mig-minors list: 15 GPU instances of 1 + 8 capabilities per GPU */
static unsigned int cap_minor(unsigned int g, int gi, int ci) {
    return 3 + g * CAPS_GI_PER_GPU * (1 + MAX_CI) + (unsigned int)gi * (1 + MAX_CI) + (ci < 0 ? 0 : 1 + (unsigned int)ci);
}

static void cap_dir(char *out, size_t n, unsigned int g, int gi, int ci) {
    if (ci < 0) snprintf(out, n, "%s/capabilities/gpu%u/mig/gi%d", node_dir, g, gi);
    else snprintf(out, n, "%s/capabilities/gpu%u/mig/gi%d/ci%d", node_dir, g, gi, ci);
}

/* Call after the instance is saved: its capability appears with it (0444: the driver's DeviceFileMode 292). */
static void cap_add(unsigned int g, int gi, int ci) {
    char dir[4400], path[4500], tmp[4600];
    snprintf(dir, sizeof dir, "%s/capabilities", node_dir);
    mkdir(dir, 0555);
    snprintf(dir, sizeof dir, "%s/capabilities/gpu%u", node_dir, g);
    mkdir(dir, 0555);
    snprintf(dir, sizeof dir, "%s/capabilities/gpu%u/mig", node_dir, g);
    mkdir(dir, 0555);
    cap_dir(dir, sizeof dir, g, gi, -1);
    mkdir(dir, 0555);
    cap_dir(dir, sizeof dir, g, gi, ci);
    mkdir(dir, 0555);
    snprintf(path, sizeof path, "%s/access", dir);
    snprintf(tmp, sizeof tmp, "%s/.access.tmp", dir);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "DeviceFileMinor: %u\nDeviceFileMode: 292\nDeviceFileModify: 1\n", cap_minor(g, gi, ci));
    fclose(f);
    chmod(tmp, 0444);
    rename(tmp, path);
}

/* Call after the instance is destroyed: its capability goes with it (a GPU instance's after its CIs'). */
static void cap_remove(unsigned int g, int gi, int ci) {
    char dir[4400], path[4500];
    cap_dir(dir, sizeof dir, g, gi, ci);
    snprintf(path, sizeof path, "%s/access", dir);
    unlink(path);
    if (ci < 0)
        for (int c = 0; c < MAX_CI; c++) cap_remove(g, gi, c);
    rmdir(dir);
}

static void load_usage(void) {
    char path[4200], *line = 0;
    size_t capacity = 0;
    n_attached = n_replays = 0;
    snprintf(path, sizeof path, "%s/usage", node_dir);
    FILE *f = fopen(path, "r");
    if (!f) return; /* nothing attached, nothing replayed */
    while (getline(&line, &capacity, f) > 0) {
        char uuid[UUID_LEN];
        int pid, used = 0;
        double t0;
        if (sscanf(line, "attach %95s %d", uuid, &pid) == 2 && n_attached < MAX_ATTACHED) {
            attached[n_attached] = (struct attached){.pid = pid};
            snprintf(attached[n_attached++].uuid, UUID_LEN, "%s", uuid);
        } else if (sscanf(line, "replay %95s %lf %n", uuid, &t0, &used) == 2 && used > 0 && n_replays < MAX_REPLAYS) {
            struct replay *r = &replays[n_replays++];
            *r = (struct replay){.t0 = t0};
            snprintf(r->uuid, UUID_LEN, "%s", uuid);
            for (char *p = line + used; r->n < MAX_POINTS;) {
                int took = 0;
                if (sscanf(p, "%lf:%lf%n", &r->seconds[r->n], &r->mib[r->n], &took) != 2) break;
                r->n++;
                p += took;
                if (*p != ',') break;
                p++;
            }
        }
    }
    free(line);
    fclose(f);
}

static int pid_alive(int pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

/* Live pids attached to a MIG device (its compute instance's UUID); up to max of them into pids. */
static unsigned int attached_pids(const char *uuid, unsigned int *pids, unsigned int max) {
    unsigned int n = 0;
    for (unsigned int k = 0; k < n_attached; k++)
        if (!strcmp(attached[k].uuid, uuid) && pid_alive(attached[k].pid)) {
            if (n < max) pids[n] = (unsigned int)attached[k].pid;
            n++;
        }
    return n;
}

/* Bytes in use on a MIG device now: its replayed trajectory's value in force (the first point's
 * before that), at most its total; 0 when nothing is replayed on it. */
static unsigned long long replayed_bytes(const char *uuid, unsigned long long total) {
    for (unsigned int k = n_replays; k-- > 0;) { /* the last line for a UUID wins */
        const struct replay *r = &replays[k];
        if (strcmp(r->uuid, uuid) || r->n == 0) continue;
        struct timeval now;
        gettimeofday(&now, 0);
        double elapsed = (double)now.tv_sec + now.tv_usec / 1e6 - r->t0, mib = r->mib[0];
        for (unsigned int i = 0; i < r->n; i++)
            if (r->seconds[i] <= elapsed) mib = r->mib[i];
        unsigned long long bytes = (unsigned long long)(mib * 1048576.0);
        return bytes < total ? bytes : total;
    }
    return 0;
}

/* ---- lookups ---- */
static const struct profile *profile_by_id(unsigned int g, unsigned int id) {
    for (unsigned int k = 0; k < gpus[g].n_profiles; k++)
        if (gpus[g].profiles[k].id == id) return &gpus[g].profiles[k];
    return 0;
}

static const struct profile *profile_by_enum(unsigned int g, unsigned int enum_value) {
    for (unsigned int k = 0; k < gpus[g].n_profiles; k++)
        if (gpus[g].profiles[k].enum_value == enum_value) return &gpus[g].profiles[k];
    return 0;
}

static const char *short_name(const struct profile *p) { /* "MIG 1g.10gb" -> "1g.10gb" */
    return strncmp(p->name, "MIG ", 4) ? p->name : p->name + 4;
}

#define IN_TABLE(handle, table) \
    ((const char *)(handle) >= (const char *)(table) && \
     (const char *)(handle) < (const char *)(table) + sizeof(table) && \
     ((const char *)(handle) - (const char *)(table)) % sizeof *(handle) == 0)

/* The full GPU a device handle stands for (its parent for a MIG device), or -1. */
static int device_gpu(nvmlDevice_t d) {
    if (IN_TABLE(d, full_gpus) || IN_TABLE(d, mig_devices)) return d->gpu < (int)n_gpus ? d->gpu : -1;
    return -1;
}

static int is_mig_device(nvmlDevice_t d) { return IN_TABLE(d, mig_devices); }

/* Call with the lock held and the state loaded: is this a live instance's handle? */
static int gi_live(nvmlGpuInstance_t h) {
    return IN_TABLE(h, gi_handles) && h->gpu < (int)n_gpus && state[h->gpu][h->gi].used;
}
static int ci_live(nvmlComputeInstance_t h) {
    return IN_TABLE(h, ci_handles) && gi_live(&gi_handles[h->gpu][h->gi]) && state[h->gpu][h->gi].ci[h->ci].used;
}
static int mig_live(nvmlDevice_t d) { return is_mig_device(d) && state[d->gpu][d->gi].used && state[d->gpu][d->gi].ci[d->ci].used; }

#define REQUIRE_INIT() do { if (init_count <= 0) return NVML_ERROR_UNINITIALIZED; } while (0)
/* Runs body with the node locked and its state loaded; body sets rc. */
#define WITH_STATE(exclusive, ...)                            \
    do {                                                      \
        if (!lock_node(exclusive)) return NVML_ERROR_UNKNOWN; \
        load_state(exclusive); /* a writer parses afresh */  \
        __VA_ARGS__;                                          \
        unlock_node();                                        \
    } while (0)

/* ---- init / shutdown / system ---- */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    const char *dir = getenv("MIG_BATCH_NVML_EMU_DIR");
    if (!dir || !*dir) {
        complain("MIG_BATCH_NVML_EMU_DIR is not set: no emulated node to serve");
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    snprintf(node_dir, sizeof node_dir, "%s", dir);
    if (!load_table()) return NVML_ERROR_UNKNOWN;
    for (int g = 0; g < MAX_GPUS; g++) {
        full_gpus[g] = (struct emu_device){g, -1, -1};
        for (int gi = 0; gi < MAX_GI; gi++) {
            gi_handles[g][gi] = (struct emu_gpu_instance){g, gi};
            for (int ci = 0; ci < MAX_CI; ci++) {
                mig_devices[g][gi][ci] = (struct emu_device){g, gi, ci};
                ci_handles[g][gi][ci] = (struct emu_compute_instance){g, gi, ci};
            }
        }
    }
    init_count++;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    REQUIRE_INIT();
    init_count--;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_text(char *out, unsigned int length, const char *text) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return copy_text(version, length, "emulated");
}
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return copy_text(version, length, "emulated");
}

/* ---- devices ---- */
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    REQUIRE_INIT();
    REQUIRE_POINTER(count);
    *count = n_gpus;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    REQUIRE_INIT();
    REQUIRE_POINTER(device);
    if (index >= n_gpus) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &full_gpus[index];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

static nvmlReturn_t mig_device_by_uuid(const char *uuid, nvmlDevice_t *device) {
    nvmlReturn_t rc = NVML_ERROR_NOT_FOUND;
    WITH_STATE(0, {
        for (unsigned int g = 0; g < n_gpus; g++)
            for (int gi = 0; gi < MAX_GI; gi++)
                for (int ci = 0; ci < MAX_CI; ci++)
                    if (state[g][gi].used && state[g][gi].ci[ci].used && !strcmp(state[g][gi].ci[ci].uuid, uuid)) {
                        *device = &mig_devices[g][gi][ci];
                        rc = NVML_SUCCESS;
                    }
    });
    return rc;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    REQUIRE_INIT();
    if (!uuid || !readable(uuid, 1)) return NVML_ERROR_INVALID_ARGUMENT;
    REQUIRE_POINTER(device);
    for (unsigned int g = 0; g < n_gpus; g++)
        if (!strcmp(gpus[g].uuid, uuid)) {
            *device = &full_gpus[g];
            return NVML_SUCCESS;
        }
    return mig_device_by_uuid(uuid, device);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    REQUIRE_INIT();
    int g = device_gpu(device);
    if (g < 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (!is_mig_device(device)) return copy_text(name, length, gpus[g].name);
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(0, {
        if (mig_live(device)) {
            char text[2 * NAME_LEN];
            const struct profile *p = profile_by_id(g, state[g][device->gi].profile_id);
            snprintf(text, sizeof text, "%s %s", gpus[g].name, p ? p->name : "MIG");
            rc = copy_text(name, length, text);
        }
    });
    return rc;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    REQUIRE_INIT();
    int g = device_gpu(device);
    if (g < 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (!is_mig_device(device)) return copy_text(uuid, length, gpus[g].uuid);
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(0, {
        if (mig_live(device)) rc = copy_text(uuid, length, state[g][device->gi].ci[device->ci].uuid);
    });
    return rc;
}

/* Bytes of memory a device has and uses: the GPU's (used: what its MIG devices use), or its GPU
 * instance profile's for a MIG device (used: its replayed trajectory, see "usage"). */
static nvmlReturn_t device_memory(nvmlDevice_t device, unsigned long long *total, unsigned long long *used) {
    int g = device_gpu(device);
    if (g < 0) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(0, {
        load_usage();
        *used = 0;
        if (!is_mig_device(device)) {
            *total = (unsigned long long)gpus[g].memory_mib << 20;
            for (int gi = 0; gi < MAX_GI; gi++)
                for (int ci = 0; ci < MAX_CI; ci++)
                    if (state[g][gi].used && state[g][gi].ci[ci].used) {
                        const struct profile *p = profile_by_id(g, state[g][gi].profile_id);
                        *used += replayed_bytes(state[g][gi].ci[ci].uuid, p ? (unsigned long long)p->memory_mib << 20 : 0);
                    }
            rc = NVML_SUCCESS;
        } else {
            const struct profile *p = mig_live(device) ? profile_by_id(g, state[g][device->gi].profile_id) : 0;
            if (p) {
                *total = (unsigned long long)p->memory_mib << 20;
                *used = replayed_bytes(state[g][device->gi].ci[device->ci].uuid, *total);
                rc = NVML_SUCCESS;
            }
        }
    });
    return rc;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    REQUIRE_INIT();
    REQUIRE_POINTER(memory);
    unsigned long long total = 0, used = 0;
    nvmlReturn_t rc = device_memory(device, &total, &used);
    if (rc == NVML_SUCCESS) *memory = (nvmlMemory_t){.total = total, .free = total - used, .used = used};
    return rc;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    REQUIRE_INIT();
    REQUIRE_POINTER(memory);
    if (memory->version != STRUCT_VERSION(nvmlMemory_v2_t, 2)) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total = 0, used = 0;
    nvmlReturn_t rc = device_memory(device, &total, &used);
    if (rc == NVML_SUCCESS)
        *memory = (nvmlMemory_v2_t){.version = memory->version, .total = total, .free = total - used, .used = used};
    return rc;
}

/* Processes on a device (a MIG device: those attached to it; the full GPU: those on any of its MIG
 * devices). NVML's protocol: *count in, the array's length; out, how many there are;
 * INSUFFICIENT_SIZE when the array (or NULL) cannot hold them. v2 is v1 plus the instance ids. */
static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *count, void *infos, int v2) {
    REQUIRE_INIT();
    REQUIRE_POINTER(count);
    int g = device_gpu(device);
    if (g < 0) return NVML_ERROR_INVALID_ARGUMENT;
    size_t size = v2 ? sizeof(nvmlProcessInfo_v2_t) : sizeof(nvmlProcessInfo_v1_t);
    unsigned int room = infos ? *count : 0;
    if (room && !readable(infos, room * size)) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    WITH_STATE(0, {
        load_usage();
        for (int gi = 0; gi < MAX_GI; gi++)
            for (int ci = 0; ci < MAX_CI; ci++) {
                struct gi_state *s = &state[g][gi];
                if (!s->used || !s->ci[ci].used) continue;
                if (is_mig_device(device) && (device->gi != gi || device->ci != ci)) continue;
                const struct profile *p = profile_by_id(g, s->profile_id);
                unsigned long long memory = replayed_bytes(s->ci[ci].uuid, p ? (unsigned long long)p->memory_mib << 20 : 0);
                unsigned int pids[MAX_ATTACHED];
                unsigned int found = attached_pids(s->ci[ci].uuid, pids, MAX_ATTACHED);
                for (unsigned int k = 0; k < found; k++, n++) {
                    if (n >= room) continue;
                    unsigned long long share = memory / found; /* the instance's memory, split evenly */
                    if (v2)
                        ((nvmlProcessInfo_v2_t *)infos)[n] = (nvmlProcessInfo_v2_t){pids[k], share, gi, ci};
                    else
                        ((nvmlProcessInfo_v1_t *)infos)[n] = (nvmlProcessInfo_v1_t){pids[k], share};
                }
            }
    });
    *count = n;
    return n > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_v1_t *infos) {
    return running_processes(device, count, infos, 0);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_v2_t *infos) {
    return running_processes(device, count, infos, 1);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_v2_t *infos) {
    return running_processes(device, count, infos, 1);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    REQUIRE_INIT();
    REQUIRE_POINTER(current);
    REQUIRE_POINTER(pending);
    int g = device_gpu(device);
    if (g < 0 || is_mig_device(device)) return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = gpus[g].mig_mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig) {
    REQUIRE_INIT();
    REQUIRE_POINTER(is_mig);
    if (device_gpu(device) < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = is_mig_device(device);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    REQUIRE_INIT();
    REQUIRE_POINTER(count);
    int g = device_gpu(device);
    if (g < 0 || is_mig_device(device)) return NVML_ERROR_INVALID_ARGUMENT;
    *count = gpus[g].mig_mode ? gpus[g].compute_slices : 0; /* the driver says 0 with MIG off */
    return NVML_SUCCESS;
}

/* MIG devices are numbered 0.. in (GPU instance id, compute instance id) order. */
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig) {
    REQUIRE_INIT();
    REQUIRE_POINTER(mig);
    int g = device_gpu(device);
    if (g < 0 || is_mig_device(device)) return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpus[g].mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    if (index >= gpus[g].compute_slices) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = NVML_ERROR_NOT_FOUND;
    WITH_STATE(0, {
        unsigned int k = 0;
        for (int gi = 0; gi < MAX_GI && rc != NVML_SUCCESS; gi++)
            for (int ci = 0; ci < MAX_CI && rc != NVML_SUCCESS; ci++)
                if (state[g][gi].used && state[g][gi].ci[ci].used && k++ == index) {
                    *mig = &mig_devices[g][gi][ci];
                    rc = NVML_SUCCESS;
                }
    });
    return rc;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *device) {
    REQUIRE_INIT();
    REQUIRE_POINTER(device);
    if (!is_mig_device(mig) || device_gpu(mig) < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &full_gpus[mig->gpu];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    REQUIRE_INIT();
    REQUIRE_POINTER(index);
    int g = device_gpu(device);
    if (g < 0 || is_mig_device(device)) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int) g;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    REQUIRE_INIT();
    REQUIRE_POINTER(id);
    if (device_gpu(device) < 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (!is_mig_device(device)) return NVML_ERROR_NOT_SUPPORTED;
    *id = device->gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    REQUIRE_INIT();
    REQUIRE_POINTER(id);
    if (device_gpu(device) < 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (!is_mig_device(device)) return NVML_ERROR_NOT_SUPPORTED;
    *id = device->ci;
    return NVML_SUCCESS;
}

/* ---- GPU instance profiles (these work with MIG off, as on the real driver) ---- */
/* Values past the last enum this emulated driver knows are rejected as the measured driver does. */
#define KNOWN_PROFILE_ENUMS 0x11

static nvmlReturn_t gpu_profile_for_enum(nvmlDevice_t device, unsigned int enum_value, const struct profile **out) {
    int g = device_gpu(device);
    if (g < 0 || is_mig_device(device)) return NVML_ERROR_INVALID_ARGUMENT;
    if (enum_value >= KNOWN_PROFILE_ENUMS) return NVML_ERROR_INVALID_ARGUMENT;
    *out = profile_by_enum(g, enum_value);
    return *out ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

static void fill_v2(nvmlGpuInstanceProfileInfo_v2_t *info, const struct profile *p) {
    *info = (nvmlGpuInstanceProfileInfo_v2_t){
        .version = 0, /* the measured driver overwrites version with 0 */
        .id = p->id, .sliceCount = p->compute_slices, .instanceCount = p->instance_count,
        .multiprocessorCount = p->sms, .copyEngineCount = p->copy_engines, .decoderCount = p->decoders,
        .encoderCount = p->encoders, .jpegCount = p->jpegs, .ofaCount = p->ofas, .memorySizeMB = p->memory_mib};
    snprintf(info->name, NAME_LEN, "%s", p->name);
}

static void fill_v3(nvmlGpuInstanceProfileInfo_v3_t *info, const struct profile *p) {
    *info = (nvmlGpuInstanceProfileInfo_v3_t){
        .version = 0, .id = p->id, .sliceCount = p->compute_slices, .instanceCount = p->instance_count,
        .multiprocessorCount = p->sms, .copyEngineCount = p->copy_engines, .decoderCount = p->decoders,
        .encoderCount = p->encoders, .jpegCount = p->jpegs, .ofaCount = p->ofas, .memorySizeMB = p->memory_mib};
    snprintf(info->name, NAME_LEN, "%s", p->name);
}

/* The versioned call: the struct's version field says which layout the caller passed. */
static nvmlReturn_t fill_versioned(void *info, const struct profile *p) {
    unsigned int version = *(unsigned int *)info;
    if (version == STRUCT_VERSION(nvmlGpuInstanceProfileInfo_v2_t, 2)) fill_v2(info, p);
    else if (version == STRUCT_VERSION(nvmlGpuInstanceProfileInfo_v3_t, 3)) fill_v3(info, p);
    else return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info) {
    REQUIRE_INIT();
    REQUIRE_POINTER(info);
    const struct profile *p = 0;
    nvmlReturn_t rc = gpu_profile_for_enum(device, profile, &p);
    if (rc != NVML_SUCCESS) return rc;
    *info = (nvmlGpuInstanceProfileInfo_t){
        .id = p->id, .sliceCount = p->compute_slices, .instanceCount = p->instance_count,
        .multiprocessorCount = p->sms, .copyEngineCount = p->copy_engines, .decoderCount = p->decoders,
        .encoderCount = p->encoders, .jpegCount = p->jpegs, .ofaCount = p->ofas, .memorySizeMB = p->memory_mib};
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile, void *info) {
    REQUIRE_INIT();
    if (!readable(info, sizeof(nvmlGpuInstanceProfileInfo_v2_t))) return NVML_ERROR_INVALID_ARGUMENT;
    const struct profile *p = 0;
    nvmlReturn_t rc = gpu_profile_for_enum(device, profile, &p);
    return rc == NVML_SUCCESS ? fill_versioned(info, p) : rc;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device, unsigned int profile_id, void *info) {
    REQUIRE_INIT();
    if (!readable(info, sizeof(nvmlGpuInstanceProfileInfo_v2_t))) return NVML_ERROR_INVALID_ARGUMENT;
    int g = device_gpu(device);
    if (g < 0 || is_mig_device(device)) return NVML_ERROR_INVALID_ARGUMENT;
    const struct profile *p = profile_by_id(g, profile_id);
    return p ? fill_versioned(info, p) : NVML_ERROR_INVALID_ARGUMENT;
}

/* All placements of the profile, whatever is in use (NVML's documented meaning). placements NULL:
 * only the count. Like the measured driver, *count is output only: all placements are written. */
nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profile_id,
                                                           nvmlGpuInstancePlacement_t *placements,
                                                           unsigned int *count) {
    REQUIRE_INIT();
    REQUIRE_POINTER(count);
    int g = device_gpu(device);
    if (g < 0 || is_mig_device(device)) return NVML_ERROR_INVALID_ARGUMENT;
    const struct profile *p = profile_by_id(g, profile_id);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    if (placements) {
        if (!readable(placements, p->n_starts * sizeof *placements)) return NVML_ERROR_INVALID_ARGUMENT;
        for (unsigned int k = 0; k < p->n_starts; k++)
            placements[k] = (nvmlGpuInstancePlacement_t){p->starts[k], p->memory_slices};
    }
    *count = p->n_starts;
    return NVML_SUCCESS;
}

/* The legacy symbol refuses media-extension profiles (fewer instances than placements), as the
 * measured driver did for 1g.18gb+me. */
nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device, unsigned int profile_id,
                                                        nvmlGpuInstancePlacement_t *placements, unsigned int *count) {
    REQUIRE_INIT();
    int g = device_gpu(device);
    if (g < 0 || is_mig_device(device)) return NVML_ERROR_INVALID_ARGUMENT;
    const struct profile *p = profile_by_id(g, profile_id);
    if (p && p->instance_count < p->n_starts) return NVML_ERROR_NOT_SUPPORTED;
    return nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profile_id, placements, count);
}

/* ---- GPU instances ---- */
static unsigned int window(unsigned int start, unsigned int size) { return ((1u << size) - 1) << start; }

static unsigned int used_slices(unsigned int g) {
    unsigned int mask = 0;
    for (int gi = 0; gi < MAX_GI; gi++)
        if (state[g][gi].used) mask |= window(state[g][gi].start, state[g][gi].size);
    return mask;
}

static unsigned int instances_of(unsigned int g, unsigned int profile_id) {
    unsigned int n = 0;
    for (int gi = 0; gi < MAX_GI; gi++) n += state[g][gi].used && state[g][gi].profile_id == profile_id;
    return n;
}

static int placement_allowed(const struct profile *p, unsigned int start) {
    for (unsigned int k = 0; k < p->n_starts; k++)
        if (p->starts[k] == start) return 1;
    return 0;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profile_id,
                                                       unsigned int *count) {
    REQUIRE_INIT();
    REQUIRE_POINTER(count);
    int g = device_gpu(device);
    if (g < 0 || is_mig_device(device)) return NVML_ERROR_INVALID_ARGUMENT;
    const struct profile *p = profile_by_id(g, profile_id);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(0, {
        unsigned int used = used_slices(g), free_windows = 0;
        for (unsigned int k = 0; k < p->n_starts; k++)
            free_windows += !(used & window(p->starts[k], p->memory_slices));
        unsigned int room = p->instance_count - instances_of(g, profile_id);
        *count = free_windows < room ? free_windows : room;
    });
    return NVML_SUCCESS;
}

/* Call with the node locked exclusively and its state loaded. */
static nvmlReturn_t create_gi(int g, const struct profile *p, unsigned int start, nvmlGpuInstance_t *out) {
    if (!placement_allowed(p, start)) return NVML_ERROR_INVALID_ARGUMENT;
    if (used_slices(g) & window(start, p->memory_slices)) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (instances_of(g, p->id) >= p->instance_count) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    int gi = 1;
    while (gi < MAX_GI && state[g][gi].used) gi++;
    if (gi == MAX_GI) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    state[g][gi] = (struct gi_state){.used = 1, .profile_id = p->id, .start = start, .size = p->memory_slices,
                                     .serial = next_serial++};
    if (!save_state()) {
        state[g][gi].used = 0;
        return NVML_ERROR_UNKNOWN;
    }
    char key[160];
    snprintf(key, sizeof key, "%s/gi-%llu", gpus[g].uuid, state[g][gi].serial);
    log_event("create", g, gi, -1, short_name(p), start, p->memory_slices, key);
    cap_add(g, gi, -1);
    *out = &gi_handles[g][gi];
    return NVML_SUCCESS;
}

/* Common checks of the two create calls; -1 with *rc set when refused. */
static int creatable(nvmlDevice_t device, unsigned int profile_id, const struct profile **p, nvmlReturn_t *rc) {
    int g = device_gpu(device);
    *rc = NVML_ERROR_INVALID_ARGUMENT;
    if (g < 0 || is_mig_device(device)) return -1;
    *rc = NVML_ERROR_NOT_SUPPORTED;
    if (!gpus[g].mig_mode) return -1;
    *rc = NVML_ERROR_NO_PERMISSION;
    if (geteuid() != 0) return -1;
    *rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!(*p = profile_by_id(g, profile_id))) return -1;
    *rc = NVML_SUCCESS;
    return g;
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profile_id,
                                                      const nvmlGpuInstancePlacement_t *placement,
                                                      nvmlGpuInstance_t *gpu_instance) {
    REQUIRE_INIT();
    REQUIRE_POINTER(placement);
    REQUIRE_POINTER(gpu_instance);
    const struct profile *p = 0;
    nvmlReturn_t rc;
    int g = creatable(device, profile_id, &p, &rc);
    if (g < 0) return rc;
    if (placement->size != p->memory_slices) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(1, rc = create_gi(g, p, placement->start, gpu_instance));
    return rc;
}

nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profile_id,
                                         nvmlGpuInstance_t *gpu_instance) {
    REQUIRE_INIT();
    REQUIRE_POINTER(gpu_instance);
    const struct profile *p = 0;
    nvmlReturn_t rc;
    int g = creatable(device, profile_id, &p, &rc);
    if (g < 0) return rc;
    WITH_STATE(1, {
        rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
        unsigned int used = used_slices(g);
        for (unsigned int k = 0; k < p->n_starts && rc == NVML_ERROR_INSUFFICIENT_RESOURCES; k++)
            if (!(used & window(p->starts[k], p->memory_slices))) rc = create_gi(g, p, p->starts[k], gpu_instance);
    });
    return rc;
}

nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpu_instance) {
    REQUIRE_INIT();
    if (!IN_TABLE(gpu_instance, gi_handles)) return NVML_ERROR_INVALID_ARGUMENT;
    if (geteuid() != 0) return NVML_ERROR_NO_PERMISSION;
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(1, {
        if (gi_live(gpu_instance)) {
            int g = gpu_instance->gpu, gi = gpu_instance->gi;
            struct gi_state *s = &state[g][gi];
            rc = NVML_SUCCESS;
            for (int ci = 0; ci < MAX_CI; ci++)
                if (s->ci[ci].used) rc = NVML_ERROR_IN_USE;
            if (rc == NVML_SUCCESS) {
                struct gi_state gone = *s;
                s->used = 0;
                if (save_state()) {
                    const struct profile *p = profile_by_id(g, gone.profile_id);
                    char key[160];
                    snprintf(key, sizeof key, "%s/gi-%llu", gpus[g].uuid, gone.serial);
                    log_event("destroy", g, gi, -1, p ? short_name(p) : "?", gone.start, gone.size, key);
                    cap_remove(g, gi, -1);
                } else {
                    rc = NVML_ERROR_UNKNOWN;
                }
            }
        }
    });
    return rc;
}

nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profile_id, nvmlGpuInstance_t *instances,
                                       unsigned int *count) {
    REQUIRE_INIT();
    REQUIRE_POINTER(count);
    int g = device_gpu(device);
    if (g < 0 || is_mig_device(device)) return NVML_ERROR_INVALID_ARGUMENT;
    const struct profile *p = profile_by_id(g, profile_id);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpus[g].mig_mode) {
        *count = 0; /* the measured driver: SUCCESS with no instances when MIG is off */
        return NVML_SUCCESS;
    }
    if (!readable(instances, p->instance_count * sizeof *instances)) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(0, {
        unsigned int n = 0;
        for (int gi = 0; gi < MAX_GI; gi++)
            if (state[g][gi].used && state[g][gi].profile_id == profile_id) instances[n++] = &gi_handles[g][gi];
        *count = n;
    });
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpu_instance) {
    REQUIRE_INIT();
    REQUIRE_POINTER(gpu_instance);
    int g = device_gpu(device);
    if (g < 0 || is_mig_device(device)) return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpus[g].mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    if (id == 0 || id >= MAX_GI) return NVML_ERROR_NOT_FOUND;
    nvmlReturn_t rc = NVML_ERROR_NOT_FOUND;
    WITH_STATE(0, {
        if (state[g][id].used) {
            *gpu_instance = &gi_handles[g][id];
            rc = NVML_SUCCESS;
        }
    });
    return rc;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpu_instance, nvmlGpuInstanceInfo_t *info) {
    REQUIRE_INIT();
    REQUIRE_POINTER(info);
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(0, {
        if (gi_live(gpu_instance)) {
            struct gi_state *s = &state[gpu_instance->gpu][gpu_instance->gi];
            *info = (nvmlGpuInstanceInfo_t){.device = &full_gpus[gpu_instance->gpu], .id = gpu_instance->gi,
                                            .profileId = s->profile_id, .placement = {s->start, s->size}};
            rc = NVML_SUCCESS;
        }
    });
    return rc;
}

/* ---- compute instance profiles: a GPU instance of n compute slices offers CIs of 1, 2, 3, 4, 6, 7
 * or 8 slices up to n; the profile id is the enum value, as on A100/H100 drivers. ---- */
static const unsigned int ci_enum_slices[] = {1, 2, 3, 4, 7, 8, 6};
#define CI_ENUMS (sizeof ci_enum_slices / sizeof *ci_enum_slices)
#define ENGINE_PROFILE_SHARED 0

struct ci_profile { unsigned int id, slices, instance_count, sms, copy_engines, decoders, encoders, jpegs, ofas; };

/* Call with the state loaded and gi_live(gpu_instance). */
static nvmlReturn_t ci_profile_of(nvmlGpuInstance_t gpu_instance, unsigned int enum_value, struct ci_profile *out) {
    const struct profile *gp = profile_by_id(gpu_instance->gpu, state[gpu_instance->gpu][gpu_instance->gi].profile_id);
    if (!gp || enum_value >= CI_ENUMS) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int slices = ci_enum_slices[enum_value], n = gp->compute_slices;
    if (slices > n) return NVML_ERROR_NOT_SUPPORTED;
    *out = (struct ci_profile){.id = enum_value, .slices = slices, .instance_count = n / slices,
                               .sms = gp->sms / n * slices, .copy_engines = gp->copy_engines,
                               .decoders = gp->decoders, .encoders = gp->encoders, .jpegs = gp->jpegs,
                               .ofas = gp->ofas};
    return NVML_SUCCESS;
}

static nvmlReturn_t ci_profile_info(nvmlGpuInstance_t gpu_instance, unsigned int enum_value, unsigned int engine,
                                    struct ci_profile *out) {
    if (engine != ENGINE_PROFILE_SHARED) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(0, {
        if (gi_live(gpu_instance)) rc = ci_profile_of(gpu_instance, enum_value, out);
    });
    return rc;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpu_instance, unsigned int profile,
                                                          unsigned int engine, nvmlComputeInstanceProfileInfo_t *info) {
    REQUIRE_INIT();
    REQUIRE_POINTER(info);
    struct ci_profile c;
    nvmlReturn_t rc = ci_profile_info(gpu_instance, profile, engine, &c);
    if (rc == NVML_SUCCESS)
        *info = (nvmlComputeInstanceProfileInfo_t){c.id, c.slices, c.instance_count, c.sms, c.copy_engines,
                                                   c.decoders, c.encoders, c.jpegs, c.ofas};
    return rc;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpu_instance, unsigned int profile,
                                                           unsigned int engine, void *info) {
    REQUIRE_INIT();
    if (!readable(info, sizeof(nvmlComputeInstanceProfileInfo_v2_t))) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int version = *(unsigned int *)info;
    int v2 = version == STRUCT_VERSION(nvmlComputeInstanceProfileInfo_v2_t, 2);
    int v3 = version == STRUCT_VERSION(nvmlComputeInstanceProfileInfo_v3_t, 3);
    if (!v2 && !v3) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct ci_profile c;
    nvmlReturn_t rc = ci_profile_info(gpu_instance, profile, engine, &c);
    if (rc != NVML_SUCCESS) return rc;
    nvmlComputeInstanceProfileInfo_v2_t out = {0, c.id, c.slices, c.instance_count, c.sms, c.copy_engines,
                                               c.decoders, c.encoders, c.jpegs, c.ofas, ""};
    snprintf(out.name, NAME_LEN, "MIG %uc", c.slices);
    if (v3) memset(info, 0, sizeof(nvmlComputeInstanceProfileInfo_v3_t)); /* capabilities: none */
    memcpy(info, &out, sizeof out); /* v3 starts with v2's layout */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gpu_instance,
                                                                unsigned int profile_id, unsigned int *count) {
    REQUIRE_INIT();
    REQUIRE_POINTER(count);
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(0, {
        struct ci_profile c;
        if (gi_live(gpu_instance) && (rc = ci_profile_of(gpu_instance, profile_id, &c)) == NVML_SUCCESS) {
            const struct profile *gp = profile_by_id(gpu_instance->gpu, state[gpu_instance->gpu][gpu_instance->gi].profile_id);
            unsigned int used = 0;
            for (int ci = 0; ci < MAX_CI; ci++)
                if (state[gpu_instance->gpu][gpu_instance->gi].ci[ci].used)
                    used += state[gpu_instance->gpu][gpu_instance->gi].ci[ci].slices;
            *count = (gp->compute_slices - used) / c.slices;
        }
    });
    return rc;
}

/* ---- compute instances ---- */
nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpu_instance, unsigned int profile_id,
                                                  nvmlComputeInstance_t *compute_instance) {
    REQUIRE_INIT();
    REQUIRE_POINTER(compute_instance);
    if (!IN_TABLE(gpu_instance, gi_handles)) return NVML_ERROR_INVALID_ARGUMENT;
    if (geteuid() != 0) return NVML_ERROR_NO_PERMISSION;
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(1, {
        struct ci_profile c;
        if (gi_live(gpu_instance) && (rc = ci_profile_of(gpu_instance, profile_id, &c)) == NVML_SUCCESS) {
            int g = gpu_instance->gpu, gi = gpu_instance->gi;
            struct gi_state *s = &state[g][gi];
            const struct profile *gp = profile_by_id(g, s->profile_id);
            unsigned int used = 0, taken = 0;
            for (int ci = 0; ci < MAX_CI; ci++)
                if (s->ci[ci].used) {
                    used |= window(s->ci[ci].start, s->ci[ci].slices);
                    taken += s->ci[ci].slices;
                }
            int ci = 0;
            while (ci < MAX_CI && s->ci[ci].used) ci++;
            unsigned int start = 0;
            while (start + c.slices <= gp->compute_slices && (used & window(start, c.slices))) start++;
            if (ci == MAX_CI || taken + c.slices > gp->compute_slices || start + c.slices > gp->compute_slices) {
                rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
            } else {
                unsigned long long serial = next_serial++;
                s->ci[ci] = (struct ci_state){.used = 1, .profile_id = c.id, .slices = c.slices, .start = start};
                /* A MIG UUID in NVML's format, unique per creation on this node. */
                unsigned long long h = 1469598103934665603ULL;
                for (const char *u = gpus[g].uuid; *u; u++) h = (h ^ (unsigned char)*u) * 1099511628211ULL;
                h ^= serial * 0x9E3779B97F4A7C15ULL;
                snprintf(s->ci[ci].uuid, UUID_LEN, "MIG-%08x-%04x-%04x-%04x-%012llx", (unsigned int)(h >> 32),
                         (unsigned int)(h >> 16) & 0xffff, (unsigned int)h & 0xffff, (unsigned int)(serial & 0xffff),
                         (h * 31 + serial) & 0xffffffffffffULL);
                if (save_state()) {
                    log_event("ci_create", g, gi, ci, short_name(gp), s->start, s->size, s->ci[ci].uuid);
                    cap_add(g, gi, ci);
                    *compute_instance = &ci_handles[g][gi][ci];
                } else {
                    rc = NVML_ERROR_UNKNOWN;
                }
            }
        }
    });
    return rc;
}

nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t compute_instance) {
    REQUIRE_INIT();
    if (!IN_TABLE(compute_instance, ci_handles)) return NVML_ERROR_INVALID_ARGUMENT;
    if (geteuid() != 0) return NVML_ERROR_NO_PERMISSION;
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(1, {
        load_usage();
        unsigned int pid;
        if (ci_live(compute_instance) &&
            attached_pids(state[compute_instance->gpu][compute_instance->gi].ci[compute_instance->ci].uuid, &pid, 1)) {
            rc = NVML_ERROR_IN_USE; /* a process still runs on it */
        } else if (ci_live(compute_instance)) {
            int g = compute_instance->gpu, gi = compute_instance->gi, ci = compute_instance->ci;
            struct gi_state *s = &state[g][gi];
            struct ci_state gone = s->ci[ci];
            s->ci[ci].used = 0;
            rc = save_state() ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
            const struct profile *gp = profile_by_id(g, s->profile_id);
            if (rc == NVML_SUCCESS) {
                log_event("ci_destroy", g, gi, ci, gp ? short_name(gp) : "?", s->start, s->size, gone.uuid);
                cap_remove(g, gi, ci);
            }
        }
    });
    return rc;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpu_instance, unsigned int profile_id,
                                                nvmlComputeInstance_t *instances, unsigned int *count) {
    REQUIRE_INIT();
    REQUIRE_POINTER(count);
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(0, {
        struct ci_profile c;
        if (gi_live(gpu_instance) && (rc = ci_profile_of(gpu_instance, profile_id, &c)) == NVML_SUCCESS) {
            if (!readable(instances, c.instance_count * sizeof *instances)) {
                rc = NVML_ERROR_INVALID_ARGUMENT;
            } else {
                unsigned int n = 0;
                struct gi_state *s = &state[gpu_instance->gpu][gpu_instance->gi];
                for (int ci = 0; ci < MAX_CI; ci++)
                    if (s->ci[ci].used && s->ci[ci].profile_id == profile_id)
                        instances[n++] = &ci_handles[gpu_instance->gpu][gpu_instance->gi][ci];
                *count = n;
            }
        }
    });
    return rc;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpu_instance, unsigned int id,
                                                   nvmlComputeInstance_t *compute_instance) {
    REQUIRE_INIT();
    REQUIRE_POINTER(compute_instance);
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(0, {
        if (gi_live(gpu_instance)) {
            rc = NVML_ERROR_NOT_FOUND;
            if (id < MAX_CI && state[gpu_instance->gpu][gpu_instance->gi].ci[id].used) {
                *compute_instance = &ci_handles[gpu_instance->gpu][gpu_instance->gi][id];
                rc = NVML_SUCCESS;
            }
        }
    });
    return rc;
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t compute_instance, nvmlComputeInstanceInfo_t *info) {
    REQUIRE_INIT();
    REQUIRE_POINTER(info);
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(0, {
        if (ci_live(compute_instance)) {
            int g = compute_instance->gpu, gi = compute_instance->gi, ci = compute_instance->ci;
            struct ci_state *s = &state[g][gi].ci[ci];
            *info = (nvmlComputeInstanceInfo_t){.device = &full_gpus[g], .gpuInstance = &gi_handles[g][gi],
                                                .id = ci, .profileId = s->profile_id,
                                                .placement = {s->start, s->slices}};
            rc = NVML_SUCCESS;
        }
    });
    return rc;
}
nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t compute_instance, nvmlComputeInstanceInfo_t *info) {
    return nvmlComputeInstanceGetInfo_v2(compute_instance, info);
}
