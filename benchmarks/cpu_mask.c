// LD_PRELOAD library: this process and its children see, through CPUID, an AVX2-only x86 CPU (no
// AVX-512, VNNI or AMX), or with CPUID_MASK=avx512 an AVX-512 one without VNNI or AMX (Skylake-SP),
// so libraries that dispatch by CPUID (onnxruntime's MLAS, numpy) run those kernels natively. It
// asks the kernel to fault on CPUID (arch_prctl ARCH_SET_CPUID, where the CPU can: the `cpuid_fault`
// flag), answers each fault with the real CPUID minus those bits, and exits with status 97 where
// faulting is unavailable, rather than run unmasked. Used by benchmarks/cpu_mask.py; never by the
// service.
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define BIT(n) (1u << (n))

static struct sigaction previous;
// CPUID_MASK=avx512: keep AVX-512 F/DQ/CD/BW/VL (a Skylake-SP: AVX-512 without VNNI); else AVX2-only.
static int keep_avx512;

static long cpuid_enabled(int enabled) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, enabled); }

static void masked_cpuid(uint32_t leaf, uint32_t subleaf, uint32_t r[4]) {
    cpuid_enabled(1);
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(subleaf));
    cpuid_enabled(0);
    if (leaf == 7 && subleaf == 0) {
        // EBX: AVX512 IFMA, PF, ER; and F, DQ, CD, BW, VL unless the profile keeps them
        r[1] &= ~(BIT(21) | BIT(26) | BIT(27));
        if (!keep_avx512) r[1] &= ~(BIT(16) | BIT(17) | BIT(28) | BIT(30) | BIT(31));
        // ECX: AVX512 VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ
        r[2] &= ~(BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14));
        // EDX: AVX512 4VNNIW, 4FMAPS, VP2INTERSECT, AMX-BF16, AVX512-FP16, AMX-TILE, AMX-INT8
        r[3] &= ~(BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) | BIT(25));
    } else if (leaf == 7 && subleaf == 1) {
        r[0] &= ~(BIT(4) | BIT(5) | BIT(23));  // AVX-VNNI, AVX512-BF16, AVX-IFMA
        r[3] &= ~(BIT(4) | BIT(5) | BIT(19));  // AVX-VNNI-INT8, AVX-NE-CONVERT, AVX10
    } else if (leaf == 0x1d || leaf == 0x1e || leaf == 0x24) {
        r[0] = r[1] = r[2] = r[3] = 0;  // AMX tile palettes, TMUL, AVX10
    }
}

static void on_segv(int sig, siginfo_t *info, void *context) {
    greg_t *regs = ((ucontext_t *)context)->uc_mcontext.gregs;
    const uint8_t *ip = (const uint8_t *)regs[REG_RIP];
    if (ip[0] == 0x0f && ip[1] == 0xa2) {  // the faulting instruction is CPUID
        uint32_t r[4];
        masked_cpuid((uint32_t)regs[REG_RAX], (uint32_t)regs[REG_RCX], r);
        regs[REG_RAX] = r[0], regs[REG_RBX] = r[1], regs[REG_RCX] = r[2], regs[REG_RDX] = r[3];
        regs[REG_RIP] += 2;
        return;
    }
    sigaction(SIGSEGV, &previous, NULL);  // a real fault: it recurs on return and ends as it would have
}

__attribute__((constructor)) static void install(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_segv;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &action, &previous);
    const char *profile = getenv("CPUID_MASK");
    keep_avx512 = profile != NULL && strcmp(profile, "avx512") == 0;
    if (cpuid_enabled(0) != 0) {  // inherited by threads and forks; execve resets it, LD_PRELOAD renews it
        fprintf(stderr, "cpu_mask: this CPU or kernel cannot fault on CPUID (no cpuid_fault)\n");
        _exit(97);
    }
}
