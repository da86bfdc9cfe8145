// LD_PRELOAD library: this process and its children see an AVX2-only x86 CPU through CPUID (no
// AVX-512, VNNI or AMX), so libraries that dispatch by CPUID (onnxruntime's MLAS, numpy) run their
// AVX2 kernels natively. It asks the kernel to fault on CPUID (arch_prctl ARCH_SET_CPUID, where the
// CPU can: the `cpuid_fault` flag), answers each fault with the real CPUID minus those bits, and
// exits with status 97 where faulting is unavailable, rather than run unmasked. Used by
// benchmarks/avx2_only.py; never by the service.
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define BIT(n) (1u << (n))

static struct sigaction previous;

static long cpuid_enabled(int enabled) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, enabled); }

static void masked_cpuid(uint32_t leaf, uint32_t subleaf, uint32_t r[4]) {
    cpuid_enabled(1);
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(subleaf));
    cpuid_enabled(0);
    if (leaf == 7 && subleaf == 0) {
        // EBX: AVX512 F, DQ, IFMA, PF, ER, CD, BW, VL
        r[1] &= ~(BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31));
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
    if (cpuid_enabled(0) != 0) {  // inherited by threads and forks; execve resets it, LD_PRELOAD renews it
        fprintf(stderr, "avx2_only: this CPU or kernel cannot fault on CPUID (no cpuid_fault)\n");
        _exit(97);
    }
}
