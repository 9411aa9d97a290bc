// emu_context.h: starting fibers and switching between them (the driver's side of Context, emu_sched.h).
#pragma once

namespace kg_emu {

#if defined(__x86_64__) && !defined(KG_EMU_UCONTEXT)
// kg_emu_switch(save_sp, to_sp): push rbp rbx r12-r15 and MXCSR/x87 control words, store rsp in
// *save_sp, load to_sp, pop the same. A new fiber's stack is laid out as if it had switched away.
asm(R"(
  .text
  .globl kg_emu_switch
  .type kg_emu_switch, @function
kg_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kg_emu_switch, .-kg_emu_switch
)");

static void context_init(Context *c, unsigned char *stack, size_t size, void (*entry)()) {
  uint64_t *top = (uint64_t *)((uintptr_t)(stack + size) & ~(uintptr_t)15);
  uint64_t *sp = top;
  *--sp = 0;  // entry's return address (it never returns); entry starts with rsp % 16 == 8, as if called
  *--sp = (uint64_t)(uintptr_t)entry;
  for (int i = 0; i < 6; ++i) *--sp = 0;  // rbp rbx r12 r13 r14 r15
  *--sp = 0;
  asm volatile("stmxcsr (%0)\n\tfnstcw 4(%0)" ::"r"(sp) : "memory");
  c->sp = sp;
}
#else
static void context_init(Context *c, unsigned char *stack, size_t size, void (*entry)()) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}
#endif

}  // namespace kg_emu
