"""Programs the node tests run as processes of their own (in a scratch netns, another mount
namespace, as another user), each a module with a `main` run by `python -m`
(`tests.harness.probe.probe_argv`). Each prints what the test asserts on, as JSON unless its
docstring says otherwise."""
