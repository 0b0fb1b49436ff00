"""The upstream tools, `mtpq upstream check|prs|prove|suite|lint`: the series as upstream pull
requests, each patch's vLLM-native tests proved, vLLM's own tests against the series, and upstream's
lint. native_plugin/ holds the pytest plugins those test runs load by name (-p)."""
