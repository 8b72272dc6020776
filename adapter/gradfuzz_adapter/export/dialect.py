"""A backend's script dialect: what an exported script says differently per backend.

Every form (compact.py, full.py, distributed.py, upstream.py) writes the same pipeline (the
values, the reference, the case built and run, the judgement) and asks the dialect of the request's
backend wherever the backends differ: which implementation the script imports or embeds,
how an op is built and its parameters copied, how a path's fusions are chosen, how a recipe
is entered, what an expected error looks like, which tensors the implementation exposes.
te_dialect.py and torch_dialect.py answer; a form never asks for a backend's name.

The class below states the questions (attributes and methods); a method that writes part of
a form takes that form's writer `w`, reads the case and the writer's names from it, and adds
what it uses to the writer's picker and helpers.
"""


class Dialect:
    """The questions; te_dialect.TEDialect and torch_dialect.TorchDialect answer them."""

    #: The backend's name, as requests and case files spell it.
    name = ""
    #: The implementation under test, in the words of build()'s docstring.
    implementation_words = ""
    #: The Sequential class the script builds the case with.
    sequential = ""
    #: The keyword set_extra_output_channel's third argument is passed with ("" positional).
    output_to_caller_keyword = ""
    #: Whether the implementation exposes channel values to a user (so the script compares
    #: channel gradients): the torch runtime's fusers do, TE does not.
    exposes_channel_gradients = False
    #: Whether a path's fusions are given to the Sequential's constructor (the torch
    #: runtime), rather than chosen in a registry the test narrows (TE's OperationFuser).
    fusions_at_construction = False
    #: Whether the Sequential's constructor validates the case's wiring (the torch runtime),
    #: rather than its first forward (TE builds its fusers there).
    validates_at_construction = False
    #: Whether the implementation documents that its in_place ops write into the caller's
    #: tensors (TE's MakeExtraOutput/AddExtraInput): no upstream test asserts against that.
    documents_in_place_writes = False
    #: Whether a repeat call's fusion plans are compared with a fresh Sequential's.
    compares_plans = False
    #: The compact form's helper that tells whether an op's bindings are locked (TEMPLATES).
    locked_helper = ""
    #: The comment that heads what a compact script embeds after EMBEDDED_MARK.
    compact_embedded_title = ""
    #: The error test's lines that open the check of a failed construction (the ops it
    #: built must be left unlocked), ending in the `if` whose body checks.
    failed_construction = []
    #: A sentence the full form's docstring ends with, or None.
    full_docstring_note = None

    # -- every form

    def device(self, case):
        """The device the script runs the case on."""
        raise NotImplementedError

    def imports(self):
        """The implementation's import lines, after `import torch`."""
        return []

    def recipe_imports(self, recipe):
        """The import lines a case under `recipe` (recipes.Recipe or None) needs besides."""
        raise NotImplementedError

    def environment(self, case):
        """Statements the compact form runs before its third-party imports (environment
        variables the implementation reads at import), or []."""
        return []

    def tf32_lines(self, case):
        """Statements that keep fp32 GEMMs in fp32 where the environment does not."""
        raise NotImplementedError

    # -- the compact form (compact.py: CompactWriter `w`)

    def recipe_lines(self, recipe):
        """Module-level lines that make the case's recipe object, or []."""
        raise NotImplementedError

    def recipe_contexts(self, recipe):
        """The context managers run() enters around the forward for the recipe, or []."""
        raise NotImplementedError

    def after_forward(self, w):
        """Statements run() makes after the forward (the recipe's state updates)."""
        raise NotImplementedError

    def after_backward(self, w):
        """Statements run() makes after autograd."""
        raise NotImplementedError

    def param_helper_ops(self, case):
        """Indices of the ops whose parameters go through the implementation's helpers."""
        raise NotImplementedError

    def compact_build(self, w):
        """build(): the case's ops made, parameters copied, bound, in a Sequential."""
        raise NotImplementedError

    def run_param_leaves(self, w, op, var):
        """(leaves, lines after autograd, whether a leaf is a list of groups): run()'s named
        parameter leaves of `op` (the script variable `var`)."""
        raise NotImplementedError

    def clears_gradients(self, w):
        """Whether a repeat call must clear gradients the implementation accumulated."""
        raise NotImplementedError

    def compact_raises(self, w, kind):
        """The error test's body up to the failed-construction check: building and running
        the case raises the error of `kind` as the implementation spells it."""
        raise NotImplementedError

    def only_fusions_template(self, w, text):
        """The only_fusions helper's text for this script (TEMPLATES["only_fusions"])."""
        return text

    # -- the full form (full.py: FullWriter `w`)

    def full_environment(self, case):
        """The header's first lines, before the imports."""
        raise NotImplementedError

    def full_sections(self):
        """[(title or None, source)] embedded after the comparison helpers."""
        raise NotImplementedError

    def full_build(self, w):
        """run_case(fusions): the case built as a user writes it and run."""
        raise NotImplementedError

    def full_raises(self, kind):
        """The error test's body: run_case raises the error of `kind`."""
        raise NotImplementedError

    # -- the distributed form (distributed.py: DistributedWriter `w`)

    def distributed_sections(self):
        """Lines embedded after the catalog: the implementation and its helpers."""
        raise NotImplementedError

    def distributed_build_op(self, w, op, i):
        """build()'s lines making op `i` on a rank from its parameter slices `mine`."""
        raise NotImplementedError

    def distributed_test_fields(self):
        """The test template's per-dialect parts: init, sequential, leaves, finish."""
        raise NotImplementedError

    # -- the upstream form (upstream.py: UpstreamWriter `w`)

    #: What the test's tolerance comment says for float32 with a GEMM (te: TF32 GEMMs).
    upstream_tf32_note = ""

    def upstream_float32_gemm_tols(self):
        """(rtol, atol) of a float32 case with a GEMM."""
        raise NotImplementedError

    def upstream_check(self, w):
        """ValueError for what the dialect's public API cannot show (ops TE lacks...)."""
        raise NotImplementedError

    def upstream_runnable_reason(self):
        """None where this process can run the dialect's tests, else why not."""
        raise NotImplementedError

    def upstream_environment(self, fault):
        """Environment variables a test run needs, with `fault` (or None) switched on."""
        raise NotImplementedError

    def upstream_imports(self, w):
        """The test file's import lines."""
        raise NotImplementedError

    def upstream_parameters(self, w):
        """The test function's parameters (defaults: dtype, device)."""
        raise NotImplementedError

    def upstream_has_device(self, w):
        """Whether the test takes a device and moves its values there (a test of the CPU
        alone does without)."""
        return True

    def upstream_doc_lines(self, w):
        """Sentences the docstring ends with (how to run it)."""
        raise NotImplementedError

    def upstream_recipe_lines(self, w):
        """Statements that make the recipe (and set what the test's scope needs)."""
        raise NotImplementedError

    def upstream_context(self, w):
        """The context manager the forward runs in (te.autocast), or None."""
        raise NotImplementedError

    def upstream_representable(self, w, names):
        """Statements that make the values `names` FP8-representable under the recipe."""
        raise NotImplementedError

    def upstream_constructor(self, w, op):
        """The statements that make `op` as the test's variable w.names.ops[op.index]."""
        raise NotImplementedError

    def upstream_sequential(self, w):
        """The expression of the test's Sequential."""
        raise NotImplementedError

    def upstream_param_attr(self, op, j):
        """The name of `op`'s parameter j ("weight", "bias")."""
        raise NotImplementedError

    def upstream_param_copies(self, w, op, var, values):
        """(statements under torch.no_grad(), statements after) that give `op` the values."""
        raise NotImplementedError

    def upstream_param_grad(self, w, op, var, j):
        """The expression of `op`'s gradient of its parameter j, in the model's layout."""
        raise NotImplementedError

    def upstream_zero_grads(self, w):
        """Statements that clear accumulated gradients between two calls."""
        raise NotImplementedError

    def upstream_after_forward(self, w):
        """Statements after a forward (between calls: the recipe's updates)."""
        raise NotImplementedError

    def upstream_after_backward(self, w):
        """Statements after a backward (delayed weight gradients, the recipe's updates)."""
        raise NotImplementedError
