// README prelude (tests/readme/compile_blocks.py): the broken variant the op-test block names
// (examples/my_op_project/test_softplus.cpp defines the same).
namespace {
struct SoftplusWithExpDerivative : my_ops::Softplus {
    static constexpr std::string_view name = "softplus with e^a as its derivative";
    template <tapegrad::Scalar T>
    static void vjp(const Settings&, const tapegrad::VjpArgs<T>& at, std::size_t, tapegrad::Tensor<T>& dA) {
        using std::exp;
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] * T(exp((*at.in[0])[k]));
    }
};
const auto broken_op = [](auto x) { return x[0].tape().template record<SoftplusWithExpDerivative>({x[0]}); };
}  // namespace
