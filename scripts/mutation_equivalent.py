"""The mutants of the harness's correctness code that cannot change a verdict, and why (scripts/mutation.py skips
them; docs/harness-tests.md tells each story). A key is (module, cosmic-ray operator, line), or with a fourth item,
cosmic-ray's occurrence number, one mutant of that operator on that line where others of them are killed."""

from __future__ import annotations

# mutants inside annotations are found by mutation.py's _annotations(), not listed here
_DIGEST = ("the seal's digest stays a keyed function of the tensor's bytes that is the same for the same bytes "
           "and changes with any one word, so a seal breaks exactly when it did")
_CHUNKS = ("the verdict and every figure are those of the whole-tensor comparison whatever the chunk (test_memory_plan.py::"
           "test_chunked_compare_is_the_whole_tensor_comparison, in compare's tests), only the time and memory differ")
EQUIVALENT: dict[tuple, str] = {
    ("integrity", "core/NumberReplacer", 26): f"_MASK 2**64 - 1 -> another width (2**63, 2**65, - 2): {_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_LShift_BitAnd", 26): f"_MASK -> -1 (no mask, an unbounded int): {_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_LShift_FloorDiv", 26): f"_MASK -> -1 (no mask): {_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_LShift_RShift", 26): f"_MASK -> -1 (no mask): {_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_LShift_Sub", 26): "_MASK -> -64 (the low 6 bits cleared): a change of "
    "the sum by d*r (r >= 1 drawn from 2**31 values) stays visible unless it lands in the same 64-block, which for "
    "a weight of that size practically never happens; measured: a one-bit change seen under 500 of 500 keys",
    ("integrity", "core/ReplaceBinaryOperator_BitAnd_Add", 46): f"the sum plus a constant instead of masked: {_DIGEST}",
    ("integrity", "core/NumberReplacer", 30): f"a key of 6 or 8 random bytes instead of 7: {_DIGEST}",
    ("integrity", "core/ReplaceComparisonOperator_NotEq_IsNot", 36): "`dtype != torch.bool` -> `is not`: torch "
    "dtypes are singletons",
    ("integrity", "core/ReplaceComparisonOperator_Eq_LtE", 37): "`x % 4 == 0` -> `x % 4 <= 0`: a remainder is never "
    "negative",
    ("integrity", "core/ReplaceBinaryOperator_Mod_Div", 37): f"words only at storage offset 0, bytes elsewhere: {_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_Mod_Mul", 37): f"words only at storage offset 0, bytes elsewhere: {_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_Mod_Pow", 37): f"words only at storage offset 0, bytes elsewhere: {_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_Mod_LShift", 37): f"words only at storage offset 0, bytes elsewhere: "
    f"{_DIGEST}",
    ("integrity", "core/NumberReplacer", 43): "sample positions drawn from [-1, n) (-1 indexes the last word) or [1, n) "
    "(word 0 never among the sampled: it is read whole below SAMPLE words, and one word of a larger tensor is read "
    "with probability SAMPLE/n either way)",
    ("integrity", "core/NumberReplacer", 45): "weights drawn from [0 or 2, 2**31), [1, 2**30) or [1, 2**32): any one "
    "word still moves the digest (a zero weight: with probability 2**-31) and two swapped words still differ",
    ("integrity", "core/ReplaceBinaryOperator_BitAnd_Mod", 46): f"the sum reduced mod 2**64 - 1 instead of 2**64: "
    f"{_DIGEST}",
    ("integrity", "core/ReplaceBinaryOperator_Mul_BitXor", 46): f"sum of word ^ weight instead of word * weight: {_DIGEST} "
    "(and a swap of two words too, as tests/harness/test_integrity.py checks under 200 keys)",
    ("buffers", "core/ReplaceBinaryOperator_Sub_Pow", 158): "ceil(n / B) -> n // B + 1: one more loop turn, "
    "over an empty slice with an empty block",
    ("buffers", "core/ReplaceBinaryOperator_Sub_BitOr", 132): "last = (max(b, a + 1) - 1) // B -> (max(b, a + 1) | 1) "
    "// B: the same block, or (b a multiple of B) one block more past the chunk's end, sliced off (its size "
    "total - k * B is never negative: k * B <= b <= total)",
    ("buffers", "core/ReplaceBinaryOperator_Sub_BitXor", 158): "(n + B - 1) -> (n + B) ^ 1: ceil(n / B) or one "
    "more loop turn, over an empty slice with an empty block",
    ("buffers", "core/NumberReplacer", 132, 22): "last = (max(b, a + 1) - 1) // B -> (max(b, a + 2) - 1) // B: "
    "at most one block more past the chunk's end (empty past the buffer's), sliced off",
    ("buffers", "core/ReplaceBinaryOperator_Sub_Pow", 132): "last = (max(b, a + 1) - 1) // B -> max(b, a + 1) // B: "
    "the same block, or one more past the chunk's end (empty past the buffer's), sliced off",
    ("buffers", "core/ReplaceBinaryOperator_Mod_BitOr", 142): "a block's seed (seed + k) % 2**63 -> (seed + k) | 2**63: "
    "seed + k < 2**63 (seed < 2**62), so the high bit added keeps every block's seed distinct and within torch's range",
    ("buffers", "core/NumberReplacer", 132, 25): "last = (max(b, a + 1) - 1) // B -> (max(b, a + 1) - 0) // B: the "
    "same block, or one more past the chunk's end (empty past the buffer's), sliced off",
    ("buffers", "core/ReplaceBinaryOperator_Sub_Add", 132): "last = (max(b, a + 1) - 1) // B -> (max(b, a + 1) + 1) // "
    "B: at most one block more past the chunk's end, sliced off",
    ("buffers", "core/ReplaceBinaryOperator_Sub_BitXor", 132): "last = (max(b, a + 1) - 1) // B -> (max(b, a + 1) ^ 1) "
    "// B: m ^ 1 is m - 1 (odd m) or m + 1 (even m): the same block or one more past the chunk's end, sliced off",
    ("buffers", "core/ReplaceBinaryOperator_Add_BitXor", 142): "a block's seed (seed + k) -> (seed ^ k): still one "
    "distinct seed per block (xor with k is one to one), below 2**63",
    ("buffers", "core/ReplaceBinaryOperator_Mod_Sub", 142): "a block's seed (seed + k) % 2**63 -> (seed + k) - 2**63: "
    "one distinct negative seed per block, within torch's range [-2**63, 2**64)",
    ("buffers", "core/NumberReplacer", 94): "POISON_BLOCK_BYTES 2**24 -> 2**25 or 2**23: the unit a random poison is "
    "made again in; the poison written and the one made again for a comparison use the same, only time and memory "
    "differ",
    ("buffers", "core/ReplaceBinaryOperator_LShift_Add", 94): "POISON_BLOCK_BYTES 2**24 -> 25 bytes: blocks of 25 bytes "
    "(many more generator seeds, slower), the same for the poison written and made again",
    ("buffers", "core/ReplaceBinaryOperator_LShift_BitXor", 94): "POISON_BLOCK_BYTES 2**24 -> 25 bytes: as `1 + 24`",
    ("buffers", "core/ReplaceBinaryOperator_LShift_Mul", 94): "POISON_BLOCK_BYTES 2**24 -> 24 bytes: as `1 + 24`",
    ("buffers", "core/ReplaceBinaryOperator_LShift_Mod", 94): "POISON_BLOCK_BYTES 2**24 -> 1 byte: as `1 + 24`",
    ("buffers", "core/ReplaceBinaryOperator_Add_BitXor", 132): "max(b, a + 1) -> max(b, a ^ 1): b >= a + 1 >= a ^ 1 "
    "where the range is not empty; an empty one at an odd a (not a block boundary) gets a's block, at an even a "
    "a + 1 as before: the same blocks",
    ("buffers", "core/ReplaceBinaryOperator_Add_BitOr", 132): "max(b, a + 1) -> max(b, a | 1): as `a ^ 1`",
    ("buffers", "core/ReplaceBinaryOperator_Sub_FloorDiv", 132): "last = (max(b, a + 1) - 1) // B -> max(b, a + 1) // "
    "B: at most one block more past the chunk's end, sliced off",
    ("buffers", "core/NumberReplacer", 143, 32): "_block draws max(n, 1) bytes instead of max(n, 0): n <= 0 only for a "
    "block past the buffer's end, which no range reaches (one byte more, sliced off, where it would)",
    ("buffers", "core/ReplaceBinaryOperator_Sub_Add", 158): "ceil(n / B) -> (n + B + 1) // B: one more loop turn, over "
    "an empty slice with an empty block",
    ("buffers", "core/ReplaceTrueWithFalse", 97): "Poison's @dataclass(frozen=True) -> frozen=False: nothing assigns "
    "to a Poison's fields",
    ("buffers", "core/NumberReplacer", 108): "Poison.seed's default 0 -> -1 or 1: every random poison is made with its "
    "seed; a byte or values poison never reads it",
    ("buffers", "core/ReplaceFalseWithTrue", 49): "GuardedBuffer.guard_copy's field repr=False -> True: its repr "
    "only",
    ("buffers", "core/ReplaceFalseWithTrue", 109): "Poison.values' field repr=False -> True: its repr only",
    ("buffers", "core/NumberReplacer", 156, 41): "a random poison's seed drawn from [-1, 2**62) instead of [0, 2**62): "
    "one value more, taken modulo 2**63 per block like the others",
    # buffers.py's second half (ninth session, 2026-11-29)
    ("buffers", "core/NumberReplacer", 76, 6): "alloc_guarded's placeholder guard_copy=torch.empty(0) -> empty(1): "
    "replaced by the guards' copy on the next line",
    ("buffers", "core/ReplaceBinaryOperator_LShift_Pow", 94): "POISON_BLOCK_BYTES 2**24 -> 1 byte: as `1 % 24`",
    ("buffers", "core/ReplaceBinaryOperator_LShift_BitOr", 94): "POISON_BLOCK_BYTES 2**24 -> 25 bytes: as `1 + 24`",
    ("buffers", "core/ReplaceBinaryOperator_Sub_Mul", 132, 1): "last = (max(b, a + 1) - 1) // B -> (max(b, a + 1) * "
    "1) // B: as `max(b, a + 1) // B`, at most one block more past the chunk's end, sliced off",
    ("buffers", "core/NumberReplacer", 142, 28): "a block's seed modulo 2**63 -> modulo 2**64: seed + k < 2**62 + "
    "the block count, so the modulo never changes it",
    ("buffers", "core/NumberReplacer", 142, 30): "a block's seed modulo 2**63 -> modulo 2**64: as `2 << 63`",
    ("buffers", "core/NumberReplacer", 142, 31): "a block's seed modulo 2**63 -> modulo 2**62: one seed per block, "
    "the same function of (seed, k) for the poison written and the one made again",
    ("buffers", "core/ReplaceBinaryOperator_Add_Sub", 142): "a block's seed (seed + k) -> (seed - k): still one "
    "distinct seed per block (taken modulo 2**63, non-negative), the same for the poison written and made again",
    ("buffers", "core/ReplaceBinaryOperator_Mod_BitXor", 142): "a block's seed (seed + k) % 2**63 -> (seed + k) ^ "
    "2**63: one distinct seed per block in [2**63, 2**64), within torch's range",
    ("buffers", "core/NumberReplacer", 143, 33): "_block draws max(n, -1) bytes instead of max(n, 0): n < 0 only for "
    "a block past the buffer's end, which no range and no loop turn reaches",
    ("buffers", "core/ReplaceComparisonOperator_Eq_GtE", 153): "pattern == 'nan' -> pattern >= 'nan' inside `if "
    "pattern in ('nan', 'huge')`: 'huge' < 'nan', so each of the two keeps its byte",
    ("buffers", "core/NumberReplacer", 156, 40): "a random poison's seed drawn from [1, 2**62) instead of [0, 2**62): "
    "one value fewer of 2**62",
    ("buffers", "core/NumberReplacer", 156, 45): "a random poison's seed drawn from [0, 2**61) instead of [0, 2**62): "
    "fewer seeds, still fresh ones, used alike for writing and making again",
    ("buffers", "core/ReplaceBinaryOperator_Sub_FloorDiv", 158): "ceil(n / B) -> (n + B // 1) // B: one more loop "
    "turn where B divides n, over an empty slice with an empty block",
    ("buffers", "core/ReplaceBinaryOperator_Sub_BitOr", 158): "ceil(n / B) -> (n + (B | 1)) // B: as `n + B + 1`",
    ("buffers", "core/ReplaceBinaryOperator_Sub_Mul", 158): "ceil(n / B) -> (n + B * 1) // B: as `n + B // 1`",
    ("buffers", "core/NumberReplacer", 158, 51): "ceil(n / B) -> (n + B - 0) // B: as `n + B // 1`",
    # compare.py's whole-module re-run (ninth session, 2026-11-29)
    ("compare", "core/NumberReplacer", 121, 51): "_too_far's RMS over max(numel, 0) instead of max(numel, 1): "
    "_too_far runs only for rel > limit, and an output with no element has rel 0",
    ("compare", "core/ReplaceComparisonOperator_Gt_NotEq", 169): "rel_err's `den > 0` -> `den != 0`: den is a norm, "
    "never negative",
    ("compare", "core/NumberReplacer", 197, 113): "_result's flat index of an empty output 0 -> -1: read only `if "
    "numel`",
    ("compare", "core/NumberReplacer", 198, 115): "_result's floor max(max_err, 0.0) -> max(max_err, -1.0): the "
    "worst error reaching it is never negative (the first chunk replaces the -1.0 start; an empty output gives 0.0)",
    ("compare", "core/NumberReplacer", 197, 111): "_result's max abs err of an empty output 0.0 -> -1.0: floored to "
    "0.0 on the next line",
    ("compare", "core/ReplaceBinaryOperator_LShift_BitOr", 60): "CHUNK_ELEMENTS 2**25 -> 25: smaller chunks (as "
    "`1 ^ 25`), the same whole-tensor verdict and figures, slower",
    ("compare", "core/NumberReplacer", 197, 112): "_result's flat index of an empty output 0 -> 1: read only `if "
    "numel`",
    ("evaluate", "core/ReplaceBinaryOperator_BitOr_Add", 42): "fresh seeds `| 1` -> `+ 1`: still never the "
    "default seed 0 (test_emu_check.py::test_fresh_seeds_are_never_the_default_seed), still fresh random values",
    ("evaluate", "core/NumberReplacer", 135): "a launch plan's refusal kept to 999 characters instead of 1000 in "
    "the message: the verdict is invalid_spec either way",
    ("evaluate", "core/ReplaceBinaryOperator_Sub_Mod", 145): "wall_s `now - started` -> `now % started`: the same "
    "while now < 2 * started, i.e. while an evaluation lasts less than the clock's whole count so far",
    ("evaluate", "core/ReplaceBinaryOperator_Sub_Mod", 213): "a phase `now - last` -> `now % last`: the same while "
    "a phase lasts less than the clock's whole count so far",
    ("evaluate", "core/ReplaceOrWithAnd", 151, 2): "`or not refs_on_gpu or not pristine_on_gpu` -> `or (not refs and "
    "not pristine)`: differs only for a plan with every timed set (3) and exactly one copy off the GPU, which "
    "plan_memory never gives (off-GPU copies come before fewer sets; 200,000 random sizes and free bytes tried)",
    ("evaluate", "core/NumberReplacer", 42, 2): "fresh seeds from 5 random bytes instead of 4: still fresh, never 0",
    ("evaluate", "core/NumberReplacer", 42, 3): "fresh seeds from 3 random bytes instead of 4: 2**24 input sets a "
    "kernel cannot know in advance, never 0",
    ("evaluate", "core/NumberReplacer", 42, 4): "fresh seeds `| 1` -> `| 2`: still never the default seed 0",
    ("evaluate", "core/ReplaceComparisonOperator_Lt_NotEq", 151): "`timed_sets < ROTATE_SETS` -> `!=`: the memory "
    "plan never gives more timed sets than ROTATE_SETS (rotate_max)",
    ("evaluate", "core/ReplaceComparisonOperator_Lt_IsNot", 151): "`timed_sets < ROTATE_SETS` -> `is not`: at most "
    "ROTATE_SETS, and small ints are one object each",
    ("evaluate", "core/NumberReplacer", 213, 20): "phases rounded to 7 digits instead of 6: finer, no verdict",
    ("evaluate", "core/NumberReplacer", 133): "the out-of-memory text kept to 199 or 201 characters instead of 200 in "
    "a harness_error's message: the verdict is the same",
    ("evaluate", "core/NumberReplacer", 165): "keep_max 0 -> 1 or -1 when the evaluation does not time: at most one set "
    "kept in memory for a timing that never comes, or none; the check and its verdict are the same",
    ("evaluate", "core/NumberReplacer", 237, 39): "`self.k < 0` -> `< -1` in _Rotation.call: timing.bench calls "
    "before_each (prepare) before every call of fn, so call() never meets k < 0",
    ("evaluate", "core/NumberReplacer", 37): "ROTATE_SETS 3 -> 4: one more input set to rotate over (memory, no "
    "verdict): any count from 2 defeats a kernel that caches by pointer or content; the memory plan still caps it",
    ("check", "core/ReplaceComparisonOperator_Is_Eq", 238): "`failed is CheckFailure.input_mutated` -> `==`: "
    "failed is a member of the enum or None, and a member equals only itself",
    ("check", "core/NumberReplacer", 377, 42): "the timed sampler's seed `urandom(8) >> 1` -> `>> 2`: still 62 "
    "random bits no kernel can know (CI's sample of 2026-11-28, seed 838302405)",
    ("check", "core/NumberReplacer", 377, 43): "the timed sampler's seed `urandom(8) >> 1` -> `>> 0`: 64 random bits, "
    "which torch.Generator.manual_seed takes (up to 2**64 - 1)",
    **{("check", f"core/ReplaceBinaryOperator_RShift_{op}", 377): "the timed sampler's seed `urandom(8) >> 1` -> "
       f"{how}: still 63 or 64 random bits, in the range torch.Generator.manual_seed takes" for op, how in (
           ("Add", "`+ 1` (past 2**64 - 1 only when all 64 bits are ones: 2**-64)"), ("Sub", "`- 1` (-1 is taken)"),
           ("BitOr", "`| 1`"), ("BitXor", "`^ 1`"), ("Mul", "`* 1`"), ("FloorDiv", "`// 1`"), ("Pow", "`** 1`"))},
    ("check", "core/NumberReplacer", 40): "BoundSet.seed's default 0 -> 1 or -1: its one constructor "
    "(ProblemState.new_set) always passes the seed",
    ("check", "core/NumberReplacer", 220): "run_check's keep_max default 0 -> 1 or -1: read only when keep is given, "
    "and its one caller that gives keep (evaluate.py) passes keep_max too",
    ("check", "core/ReplaceComparisonOperator_Eq_GtE", 190): "`r.device.type == self.device.type` -> `>=` in "
    "seal_refs: a reference lies on the state's device or in host memory, and \"cpu\" sorts before \"cuda\"",
    ("check", "core/NumberReplacer", 229): "`max(limits, default=0.0)` -> 1.0 or -1.0: every problem has an output, "
    "so the default is never taken",
    ("check", "core/ReplaceComparisonOperator_Eq_Is", 306): "`a.device == b.device` -> `is` in _equal: equal devices "
    "that are not one object take the chunked path, with the same answer",
    ("check", "core/ReplaceComparisonOperator_NotEq_Gt", 306): "`a.device.type != \"cpu\"` -> `> \"cpu\"`: every "
    "other torch device type sorts after \"cpu\"",
    ("check", "core/ReplaceComparisonOperator_Eq_IsNot", 311): "`a.device.type == \"cpu\"` -> `is not` in _equal: "
    "only which device compares the two chunks changes (both are moved there), not the answer",
    ("check", "core/ReplaceBinaryOperator_LShift_Pow", 312): "_equal's chunk `1 << 26` -> `1 ** 26` (1 element): the "
    "same answer element by element, only slower (the 2**27-byte test then runs past the mutant's time limit)",
    ("check", "core/NumberReplacer", 359): "TIMED_SAMPLES 1024 -> 1023 or 1025 sampled elements per timed call: the "
    "same protection, one element more or less",
    **{("check", f"core/ReplaceComparisonOperator_NotEq_{op}", 306): "`a.device.type != \"cpu\"` -> another "
       "comparison in _equal: it only picks torch.equal on the whole or the chunked comparison, which give the same "
       "answer" for op in ("Eq", "Is", "IsNot", "Lt", "LtE", "GtE")},
    **{("check", f"core/ReplaceComparisonOperator_Eq_{op}", 311): "`a.device.type == \"cpu\"` -> another comparison "
       "in _equal: only which device compares the two chunks changes (both are moved there), not the answer"
       for op in ("NotEq", "Lt", "Gt", "GtE", "Is")},
    ("check", "core/ReplaceComparisonOperator_NotEq_IsNot", 308, 4): "`a.dtype != b.dtype` -> `is not`: torch dtypes "
    "are singletons",
    ("check", "core/ReplaceComparisonOperator_Is_Eq", 299): "`copy is RunCopy.gpu` -> `==`: enum members equal only "
    "themselves",
    ("check", "core/ReplaceFalseWithTrue", 193): "ProblemState.reference's default to_host False -> True: the same "
    "its one caller (_check_one_set) always passes to_host",
    ("check", "core/ReplaceAndWithOr", 147): "`n in tensors and isinstance(x, Tensor)` -> `or` in new_set: the "
    "problem's tensor inputs (info.inputs) are exactly forward's tensor arguments, so the two tests agree",
    ("check", "core/NumberReplacer", 371): "TimedSampler.calls starts at 1 or -1: a count in the failure's message",
    ("check", "core/ReplaceBinaryOperator_LShift_BitOr", 312): "_equal's chunk `1 << 26` -> `1 | 26` (27 elements): "
    "the same answer, only slower",
    ("check", "core/ReplaceComparisonOperator_Eq_LtE", 190): "`r.device.type == self.device.type` -> `<=` in "
    "seal_refs: a reference moved to host memory is sealed too (its digest never changes: out of any kernel's reach)",
    ("check", "core/ReplaceComparisonOperator_Is_LtE", 238): "`failed is input_mutated` -> `<=` (string order): "
    "reset_params also after some other failures, and restoring intact parameters changes nothing",
    ("check", "core/ReplaceComparisonOperator_Is_GtE", 238): "`failed is input_mutated` -> `>=` (string order): "
    "reset_params also after the failures sorting after it, and restoring intact parameters changes nothing",
    ("check", "core/ReplaceComparisonOperator_Is_Eq", 297): "`copy is RunCopy.host` -> `==`: enum members equal "
    "only themselves",
    ("check", "core/NumberReplacer", 63): "ProblemState's default seed 1234 -> 1233 or 1235: the reference model's "
    "weights from another fixed seed (the guards and poisons are seeded afresh), the same for every candidate",
    ("check", "core/NumberReplacer", 370): "TimedSampler.samples starts at 1 or -1: a count in the failure's message",
    ("check", "core/NumberReplacer", 383): "TimedSampler.calls counts by 2 or 0: a count in the failure's message",
    ("check", "core/ReplaceBinaryOperator_LShift_Add", 312): "_equal's chunk `1 << 26` -> `1 + 26`: the same answer "
    "in chunks of 27 elements, only slower",
    ("check", "core/NumberReplacer", 312, 30): "_equal's chunk 2**26 -> 2**27 or 2**25 elements: the same answer",
    ("check", "core/NumberReplacer", 312, 31): "_equal's chunk 2**26 -> 2**27 or 2**25 elements: the same answer",
    ("check", "core/RemoveDecorator", 52): "Footprint without @dataclass: it is made only by ProblemState.footprint, "
    "GPU-only code (CUDA memory queries) whose mutants are skipped",
    ("check", "core/ReplaceTrueWithFalse", 52): "Footprint's @dataclass(frozen=True) -> frozen=False: nothing assigns to "
    "a Footprint's fields (it is read once by the memory plan), so freezing changes no verdict",
    ("check", "core/ReplaceComparisonOperator_Eq_IsNot", 190): "`r.device.type == self.device.type` -> `is not` in "
    "seal_refs: device.type gives a new str on every call, so every reference is sealed, host ones too, whose "
    "digest never changes (out of any kernel's reach)",
    ("check", "core/AddNot", 201): "`.cpu() if to_host` negated in ProblemState.reference: the same values, on the "
    "other side (the comparison reads either)",
    ("check", "core/AddNot", 306): "`a.device == b.device and ...` negated in _equal: a choice between torch.equal on "
    "the whole and the chunked comparison, the same answer",
    ("check", "core/ReplaceComparisonOperator_Eq_IsNot", 306): "`a.device == b.device` -> `is not` in _equal: a "
    "choice between torch.equal on the whole and the chunked comparison, the same answer",
    ("check", "core/ReplaceComparisonOperator_Eq_NotEq", 306): "`a.device == b.device` -> `!=` in _equal: a choice "
    "between torch.equal on the whole and the chunked comparison, the same answer",
    ("check", "core/ReplaceAndWithOr", 306): "`a.device == b.device and a.device.type != \"cpu\"` -> `or` in _equal: "
    "a path choice, and its one mixed-device call (the first run in host memory as a) takes the chunked path either way",
    ("check", "core/AddNot", 311): "`a.device.type == \"cpu\"` negated in _equal: only which device compares the two "
    "chunks changes (both are moved there), not the answer",
    ("check", "core/NumberReplacer", 312, 28): "_equal's chunk `1 << 26` -> `2 << 26`: chunks of 2**27, the same answer",
    **{("check", f"core/ReplaceBinaryOperator_LShift_{op}", 312): f"_equal's chunk `1 << 26` -> `1 {sym} 26` ({n} "
       "elements): the same answer, only slower" for op, sym, n in (("BitXor", "^", 27), ("Mul", "*", 26),
                                                                     ("Mod", "%", 1))},
    ("check", "core/NumberReplacer", 377, 41): "the timed sampler's seed from `urandom(7)` instead of 8 bytes: 55 "
    "random bits no kernel can know (`urandom(9)`, 71 bits, is past manual_seed's range and killed)",
    ("check", "core/NumberReplacer", 390, 51): "`randint(0, n)` -> `randint(-1, n)` in the timed sampler: index -1 is "
    "the last element, so every element can still be drawn",
    ("check", "core/ReplaceComparisonOperator_Eq_LtE", 387): "`n == 0` -> `n <= 0` for an output's numel, never "
    "negative (CI's sample of 2026-11-28, seed 1670868624)",
    ("check", "core/ReplaceComparisonOperator_Eq_LtE", 311): "`a.device.type == \"cpu\"` -> `<= \"cpu\"`: no "
    "torch device type sorts before \"cpu\" (cuda, meta, mps, xpu, hip, ... all sort after it)",
    ("compare", "core/ReplaceBinaryOperator_LShift_Mul", 60): "CHUNK_ELEMENTS `1 << 25` -> `1 * 25`: chunks of 25 "
    "elements give the whole-tensor verdict, only slower (test_memory_plan.py::"
    "test_chunked_compare_is_the_whole_tensor_comparison; CI's sample of 2026-11-28, seed 3047662003)",
    ("compare", "core/ReplaceBinaryOperator_LShift_BitXor", 60): "CHUNK_ELEMENTS `1 << 25` -> `1 ^ 25` (24): chunks "
    f"of 24 elements: {_CHUNKS}",
    ("compare", "core/ReplaceBinaryOperator_LShift_Add", 60): f"CHUNK_ELEMENTS `1 << 25` -> `1 + 25` (26): {_CHUNKS}",
    ("compare", "core/ReplaceBinaryOperator_Mul_Div", 66): "compare(out, ref, *, atol, ...) -> (out, ref, /, atol, "
    "...): every caller passes out and ref by position and the rest by name, which both signatures take alike",
    ("compare", "core/NumberReplacer", 89): "describe(..., atol=0.0, rtol=0.0, exact=True): with exact the pattern "
    "reads `out != ref` and `a == b` (error_pattern.py), never atol or rtol, so any numbers there give the same text",
    ("compare", "core/ReplaceComparisonOperator_Eq_LtE", 185): "`nbad == 0` -> `nbad <= 0`: nbad is a count of "
    "elements, never negative",
    ("compare", "core/ReplaceComparisonOperator_Eq_LtE", 174): "`worst.numel() == 0` -> `<= 0`: a count of "
    "elements, never negative",
    ("compare", "core/NumberReplacer", 94, 40): "`range(0, max(numel, 1), step)` -> `max(numel, 2)`: one more "
    "loop turn at most (numel 0 or 1), over empty slices, which add nothing to the totals",
    ("compare", "core/NumberReplacer", 146): "_Totals.bad_worst's start (-1.0, 0, 0.0, 0.0), any number changed: "
    "it is read only when an element mismatched, and the first chunk with one replaces it (`err > best[0]`), its "
    "error being > 0 (isclose holds for equal values; a NaN's error counts as inf)",
    ("compare", "core/ReplaceUnaryOperator_USub_Not", 146): "_Totals.bad_worst's start error -1.0 -> `not 1.0` "
    "(False, 0): a mismatched element's error is > 0, so the first chunk with one replaces it as before",
    **{("compare", "core/NumberReplacer", 145, k): "_Totals.ok_worst's starting index, got or expected changed: the "
       "first chunk replaces the whole start (its error >= 0 > -1.0), and an empty output reports none of it (_result)"
       for k in range(66, 72)},
    ("compare", "core/NumberReplacer", 145, 64): "_Totals.ok_worst's start error -1.0 -> -2.0: an element's error is "
    ">= 0, above either, so the first chunk replaces the start as before",
    ("compare", "core/ReplaceBinaryOperator_BitAnd_Mul", 188): "`still_poisoned(...) & bad` -> `*` in _compare_exact: "
    "both are bool tensors, whose product is their logical and, of dtype bool",
    ("compare", "core/ReplaceComparisonOperator_Eq_LtE", 99): "`acc.nbad == 0` -> `<= 0`: a count, never negative",
    ("compare", "core/ReplaceComparisonOperator_NotEq_IsNot", 79): "`out.dtype != ref.dtype` -> `is not`: torch "
    "dtypes are singletons",
    ("compare", "core/NumberReplacer", 60, 29): f"CHUNK_ELEMENTS `1 << 25` -> `1 << 24`: {_CHUNKS}",
    ("compare", "core/NumberReplacer", 198, 111): "`max(max_err, 0.0)` -> `-1.0`: the worst error is never "
    "negative there (an element's error >= 0, an exact mismatch's 1.0, an empty output's 0.0)",
    ("compare", "core/ReplaceBinaryOperator_BitAnd_Mul", 153): "`isfinite(o) & isfinite(r)` -> `*`: both are bool "
    "tensors, whose product is their logical and, of dtype bool",
    ("compare", "core/NumberReplacer", 94, 41): "`range(0, max(numel, 1), step)` -> `max(numel, 0)`: an empty output "
    "gets no loop turn instead of one over empty slices, which adds nothing to the totals",
    ("compare", "core/NumberReplacer", 94, 43): "`max(1, chunk)` -> `max(0, chunk)`: differs only for chunk <= 0, "
    "which no caller gives (CHUNK_ELEMENTS; the tests' chunks are >= 1)",
    ("compare", "core/ReplaceBinaryOperator_BitAnd_Mul", 161): "`bad & ~finite` -> `*`: both are bool tensors, "
    "whose product is their logical and, of dtype bool (CI's sample of 2026-11-28, seed 2748359795)",
    ("compare", "core/ReplaceBinaryOperator_BitAnd_Mul", 162): "`still_poisoned(...) & bad` -> `*`: both are bool "
    "tensors, whose product is their logical and, of dtype bool",
}
