#!/usr/bin/env python3
"""make_chat_ref.py — reference renderings of the chat templates for tests/test-chat.c.

The published Jinja chat templates of the families engine/text/chat.c renders in C (Gemma 2,
Gemma 3, Phi-3-mini, Qwen3 (ChatML), Llama-3, Llama-2) rendered by transformers' own chat-template
renderer (transformers.utils.chat_template_utils.render_jinja_template: the sandboxed Jinja
environment with trim_blocks/lstrip_blocks that tokenizer.apply_chat_template uses, with the
tokenizer's bos_token/eos_token passed as apply_chat_template passes them) for a few
conversations each. test-chat.c renders the same conversations with zs_chat_render and compares
byte for byte; for the conversations a template refuses (raise_exception) it expects an error.
It also checks that zs_chat_template_classify names each template text's family.

Writes tests/ref/chat-ref.json:
  {"templates": {name: {"family", "source", "text"}},
   "cases": [{"template", "family", "bos", "eos", "gen", "messages": [{role, content}],
              "text"  (what the template renders)  |  "error" (the template's exception)}]}

Template texts: the "chat_template" strings of the tokenizer_config.json files named in `source`
(Hugging Face model repositories), as published; each was checked against copies of the same
text in public code (e.g. the Gemma 2 and Phi-3 ones in llama.cpp's tests/test-chat-template.cpp
and guidance's chat templates, Qwen3's in projects that pin Qwen/Qwen3-0.6B). Where the C
renderer deliberately differs from a template, the case is left out here and the difference is
written in engine/text/chat.h (Gemma 2's refusal of a system message, Qwen3's <think> handling of
a final assistant turn and of earlier turns holding "</think>", Phi-3.5's dropping of an empty
system message).

`make test` does not need Python; rerun this only to regenerate the data, from the repository root:

  python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch==2.9.1 transformers==4.57.3
  /tmp/tv/bin/python tests/ref/make_chat_ref.py

(versions used for the committed data: transformers 4.57.3, jinja2 3.1.6).
"""
import json, os, sys

from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, 'chat-ref.json')

GEMMA2 = (
    r"""{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"""
    r"""{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception("""
    r"""'Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == """
    r"""'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + """
    r"""role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{"""
    r"""'<start_of_turn>model\n'}}{% endif %}""")

GEMMA3 = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

PHI3_MINI = (
    r"""{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + """
    r"""'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif """
    r"""message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"""
    r"""{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}""")

QWEN3 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

LLAMA3 = (
    r"""{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + """
    r"""message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"""
    r"""{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ """
    r"""'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}""")

LLAMA2 = (
    r"""{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = """
    r"""messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"""
    r"""{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ """
    r"""raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if """
    r"""loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + """
    r"""message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"""
    r"""{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + """
    r"""content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}""")

# name: (family as chat.c names it, source, text, bos_token, eos_token)
TEMPLATES = {
    'gemma-2': ('gemma', 'https://huggingface.co/google/gemma-2-2b-it/blob/main/tokenizer_config.json', GEMMA2,
                '<bos>', '<eos>'),
    'gemma-3': ('gemma', 'https://huggingface.co/google/gemma-3-1b-it/blob/main/tokenizer_config.json', GEMMA3,
                '<bos>', '<eos>'),
    'phi-3-mini': ('phi3', 'https://huggingface.co/microsoft/Phi-3-mini-4k-instruct/blob/main/tokenizer_config.json',
                   PHI3_MINI, '<s>', '<|endoftext|>'),
    'qwen3': ('chatml', 'https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/tokenizer_config.json', QWEN3, None,
              '<|im_end|>'),
    'llama-3': ('llama-3', 'https://huggingface.co/meta-llama/Meta-Llama-3-8B-Instruct/blob/main/tokenizer_config.json',
                LLAMA3, '<|begin_of_text|>', '<|eot_id|>'),
    'llama-2': ('llama-2', 'https://huggingface.co/meta-llama/Llama-2-7b-chat-hf/blob/main/tokenizer_config.json',
                LLAMA2, '<s>', '</s>'),
}


def M(*pairs):
    return [{'role': r, 'content': c} for r, c in pairs]


SYS_MULTI = M(('system', 'You are terse. '), ('user', ' Hi \n'), ('assistant', '\tHello there.  '), ('user', 'How are you?'))
USER1 = M(('user', 'Hello!'))
PAIR = M(('user', 'What is 2+2?'), ('assistant', ' 4 '))
UNI_WS = M(('user', '\u00a0\u3000Gr\u00fc\u00dfe \u65e5\u672c\u2003\n\x1c'), ('assistant', '\u2028ok\u0085'))
SPACED = M(('user', '  spaced out  \n'))
EMPTY_SYS = M(('system', ''), ('user', 'Hi'))
TWO_USERS = M(('user', 'a'), ('user', 'b'))
ASST_FIRST = M(('assistant', 'a'), ('user', 'b'))
SYS_LATE = M(('user', 'a'), ('system', 'b'), ('user', 'c'))

# (template, messages, add_generation_prompt)
CASES = [
    ('gemma-2', USER1, True), ('gemma-2', SYS_MULTI[1:], True), ('gemma-2', SYS_MULTI[1:], False),
    ('gemma-2', PAIR, False), ('gemma-2', UNI_WS, True), ('gemma-2', TWO_USERS, True),
    ('gemma-2', ASST_FIRST, True),
    ('gemma-3', USER1, True), ('gemma-3', SYS_MULTI, True), ('gemma-3', SYS_MULTI, False),
    ('gemma-3', SYS_MULTI[1:], True), ('gemma-3', M(('system', ' Be brief.\n'), ('user', '  Hi')), True),
    ('gemma-3', M(('system', 'S'), ('user', '')), True), ('gemma-3', PAIR, False), ('gemma-3', UNI_WS, True),
    ('gemma-3', TWO_USERS, True), ('gemma-3', ASST_FIRST, True), ('gemma-3', M(('system', 'S'), ('assistant', 'a')), True),
    ('phi-3-mini', SYS_MULTI, True), ('phi-3-mini', SYS_MULTI, False), ('phi-3-mini', USER1, True),
    ('phi-3-mini', PAIR, False), ('phi-3-mini', SPACED, True), ('phi-3-mini', EMPTY_SYS, True),
    ('phi-3-mini', SYS_LATE, True), ('phi-3-mini', UNI_WS, False),
    ('qwen3', SYS_MULTI, True), ('qwen3', USER1, True), ('qwen3', SPACED, True), ('qwen3', SYS_LATE, True),
    ('qwen3', M(('user', 'a'), ('assistant', 'b'), ('user', 'c'), ('assistant', 'd'), ('user', 'e')), True),
    ('llama-3', SYS_MULTI, True), ('llama-3', PAIR, False), ('llama-3', UNI_WS, True),
    ('llama-2', SYS_MULTI, True), ('llama-2', PAIR, False), ('llama-2', UNI_WS, True), ('llama-2', TWO_USERS, True),
]


def main():
    out = {'templates': {}, 'cases': []}
    for name, (family, source, text, _, _) in TEMPLATES.items():
        out['templates'][name] = {'family': family, 'source': source, 'text': text}
    for name, msgs, gen in CASES:
        family, _, text, bos, eos = TEMPLATES[name]
        case = {'template': name, 'family': family, 'bos': bos, 'eos': eos, 'gen': gen, 'messages': msgs}
        try:
            rendered, _ = render_jinja_template(conversations=[msgs], chat_template=text, add_generation_prompt=gen,
                                                bos_token=bos, eos_token=eos)
            case['text'] = rendered[0]
        except Exception as e:  # the template's raise_exception (jinja2 TemplateError)
            case['error'] = str(e)
        out['cases'].append(case)
    with open(OUT, 'w', encoding='utf-8') as f:
        json.dump(out, f, indent=1, ensure_ascii=True)
        f.write('\n')
    print(f'wrote {OUT}: {len(out["cases"])} cases', file=sys.stderr)


if __name__ == '__main__':
    main()
