"""plasmid-multiturn: multi-turn rollouts with tool calls (``--generate multiturn --tools ...``).

The model answers, calls a tool, reads its answer and goes on, up to ``--max-turns`` turns and a
budget of ``--max-response-tokens`` for the whole response; the sample keeps exactly the token ids
the engine generated (trained on) and those of the text the tools added (masked out). See
:mod:`plasmid_multiturn.generate` for the loop and its token layout, and
:mod:`plasmid_multiturn.formats` for the tool-call formats (``--tool-call-format tagged`` or
``chat-template``). Tools come from the tool family (``plasmid_tools``, ``--tools NAME,...``).
"""
