// The target that precompiles tapegrad.hpp for the programs built in this tree (tests, examples,
// tools), which reuse its header (CMakeLists.txt, tapegrad_precompiled). Nothing is compiled from
// this file itself.
