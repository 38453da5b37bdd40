"""The outcomes of stage 04's rows, defined once: the protocol in 04_eval_kernels.py gives each row one, its
summary counts them, and research/compare_objectives.py and research/outcome_table.py read them.

A row the protocol judges ends in one of OUTCOMES, listed in the order of the step that decides it
(docs/evaluation.md, "Protocol"):

    missing        --solutions has no answer for the job
    no_code        the reply holds no code block to compile
    compile_error  nvcc refuses the program (or does not finish within --compile-timeout)
    runtime_error  the program exits with an error
    timeout        the program does not exit within its budget
    wrong_output   the task's compare.py judges what the program wrote F
    no_kernel      ... T, but the program launched no kernel: it computed on the host (standalone mode;
                   harness/launch_count.py); a failure of the model like wrong_output
    pass           ... T, and a kernel ran

A program is judged on each of the run's input sets (harness/input_sets.py): its outcome is that of the
first set it does not pass on, `pass` only when it passes on every one.

Three more carry no verdict on the program, and are counted apart, outside pass@k (APART): the emulator
could not run it, the task itself is broken, or (--engine openai) the server gave no reply to judge.
"""

OUTCOMES = (
    "missing",
    "no_code",
    "compile_error",
    "runtime_error",
    "timeout",
    "wrong_output",
    "no_kernel",
    "pass",
)
NOT_COMPILED = OUTCOMES[:3]  # the outcomes of a row whose program was never built
NO_KERNEL = "no_kernel"  # the right outputs, computed without a kernel launch
UNSUPPORTED = "unsupported"  # nvcc compiles it, but the CPU emulator cannot run it
TASK_ERROR = "task_error"  # gen.py failed, or compare.py rejects the task's own reference
GENERATION_ERROR = "generation_error"  # the server gave no reply (a resumed run asks again)
APART = (UNSUPPORTED, TASK_ERROR, GENERATION_ERROR)
