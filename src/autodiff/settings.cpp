/// \file
/// The compiled part of autodiff/settings.hpp: a settings value as text (settings_text), kept out
/// of the header so that a program including the ops does not compile its visit and formatting.
#include "autodiff/settings.hpp"

#include <fmt/core.h>

#include <string>
#include <variant>
#include <vector>

namespace tapegrad {

std::string settings_text(const SettingsValue& value) {
    struct Text {
        std::string operator()(std::size_t n) const { return fmt::format("{}", n); }
        std::string operator()(bool b) const { return b ? "true" : "false"; }
        std::string operator()(float x) const { return fmt::format("{}", x); }
        std::string operator()(double x) const { return fmt::format("{}", x); }
        std::string operator()(const SettingsChoice& c) const {
            return c.index < c.names.size() ? std::string(c.names[c.index]) : fmt::format("#{}", c.index);
        }
        std::string operator()(const std::vector<std::size_t>& counts) const {
            constexpr std::size_t shown = 8;
            std::string text = "[";
            for (std::size_t k = 0; k < counts.size() && k < shown; ++k)
                text += fmt::format("{}{}", k ? ", " : "", counts[k]);
            return counts.size() > shown ? text + fmt::format(", ... ({} in all)]", counts.size()) : text + "]";
        }
        std::string operator()(const std::vector<SettingsEntry>& entries) const {
            return fmt::format("{{{}}}", fields(entries));  // fmt: GCC 12 warns falsely on "{" + std::string
        }
        std::string fields(const std::vector<SettingsEntry>& entries) const {
            std::string text;
            for (const SettingsEntry& e : entries) {
                text += fmt::format("{}{}={}", text.empty() ? "" : ", ", e.name, std::visit(*this, e.value));
            }
            return text;
        }
    };
    if (const auto* entries = std::get_if<std::vector<SettingsEntry>>(&value)) return Text{}.fields(*entries);
    return std::visit(Text{}, value);
}

}  // namespace tapegrad
