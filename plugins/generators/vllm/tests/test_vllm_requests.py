"""What plasmid sends to vLLM's ``/v1/completions`` (no server needed)."""

from __future__ import annotations

from plasmid_vllm.engine import completion_body

from plasmid.types import SamplingParams


def test_sampling_parameters_map_to_a_streamed_completion_of_token_ids():
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=12, stop_token_ids=(2, 5), seed=9)
    body = completion_body("tiny", [1, 4, 5], params)
    assert body == {"model": "tiny", "prompt": [1, 4, 5], "max_tokens": 12, "temperature": 0.7, "top_p": 0.9,
                    "top_k": 0, "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True,
                    "ignore_eos": True, "stop_token_ids": [2, 5], "stream": True, "skip_special_tokens": False,
                    "seed": 9}


def test_stop_strings_go_to_vllm_with_the_stop_text_kept_in_the_output():
    body = completion_body("tiny", [1], SamplingParams(max_new_tokens=4, stop=("\nObservation:", "END")))
    assert body["stop"] == ["\nObservation:", "END"] and body["include_stop_str_in_output"] is True
    plain = completion_body("tiny", [1], SamplingParams(max_new_tokens=4))
    assert "stop" not in plain and "include_stop_str_in_output" not in plain and "seed" not in plain
