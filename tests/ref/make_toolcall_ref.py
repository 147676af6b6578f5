"""make_toolcall_ref.py — reference renderings of chat conversations with tools for
tests/test-toolcall.c (engine/text/toolcall.c): what the published Jinja chat templates of
Qwen2.5-Instruct (format hermes), Llama-3.1-Instruct (llama3) and Mistral-Nemo-Instruct-2407
(mistral, a v3 template with [AVAILABLE_TOOLS]) produce with transformers' renderer (the one
apply_chat_template(messages, tools=..., add_generation_prompt=...) uses), written to
tests/ref/toolcall-ref.json.

The template texts are not committed: pass the directory that holds them, e.g. from
llama.cpp's repository (https://github.com/ggml-org/llama.cpp, tests/chat/templates/ and
models/templates/):

  qwen2.5.jinja       Qwen-Qwen2.5-7B-Instruct.jinja
  llama3.1.jinja      meta-llama-Llama-3.3-70B-Instruct.jinja (the same template as Llama 3.1's)
  mistral-nemo.jinja  mistralai-Mistral-Nemo-Instruct-2407.jinja

Llama 3.1's template writes "Today Date: {date_string}"; no date_string is passed, so the
template's default "26 Jul 2024" is used (toolcall.c writes the same). Its tools go into the
first user message (tools_in_user_message's default). Tool-call arguments are passed as dicts
(what the templates expect; the JSON stores them as OpenAI's argument strings), tools as
OpenAI's {"type": "function", "function": {name, description, parameters}}.

Cases without tools are marked "no_tools": the C renderer must then equal zs_chat_render
(chat.c), which differs on purpose from these templates' tool-less output for Qwen2.5 (its
default system message) and Llama 3.1 (its date header); for Mistral the tool-less text is
also stored (chat.c's mistral family renders it). Cases where the template raises store
"error".

`make test` does not need Python; rerun this only to regenerate the data, from the repository
root:

  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install transformers==4.57.3
  /tmp/venv/bin/python tests/ref/make_toolcall_ref.py /path/to/templates

(versions used for the committed data: transformers 4.57.3, jinja2 3.1.6).
"""
import copy, json, os, sys

from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, 'toolcall-ref.json')

# name: (file, chat family as chat.c names it, tool format, bos, eos)
TEMPLATES = {
    'qwen2.5': ('qwen2.5.jinja', 'chatml', 'hermes', None, '<|im_end|>'),
    'llama-3.1': ('llama3.1.jinja', 'llama-3', 'llama3', '<|begin_of_text|>', '<|eot_id|>'),
    'mistral-nemo': ('mistral-nemo.jinja', 'mistral', 'mistral', '<s>', '</s>'),
}


def tool(name, description, parameters):
    f = {'name': name}
    if description is not None:
        f['description'] = description
    if parameters is not None:
        f['parameters'] = parameters
    return {'type': 'function', 'function': f}


WEATHER = tool('get_weather', 'Current weather in a city (M\u00e9t\u00e9o)', {
    'type': 'object',
    'properties': {
        'city': {'type': 'string', 'description': 'City name, e.g. "Paris"'},
        'unit': {'type': 'string', 'enum': ['celsius', 'fahrenheit']},
    },
    'required': ['city'],
})
SEARCH = tool('search_docs', 'Search the documentation', {
    'type': 'object',
    'properties': {
        'query': {'type': 'string'},
        'limit': {'type': 'integer', 'minimum': 1, 'default': 5},
        'threshold': {'type': 'number', 'default': 0.5},
        'filters': {'type': 'array', 'items': {'type': 'object', 'properties': {'field': {'type': 'string'}}}},
        'options': {'type': 'object', 'properties': {}},
    },
    'required': ['query', 'limit'],
})
NOW = tool('get_time', None, {'type': 'object', 'properties': {}})
TOOLS = [WEATHER, SEARCH, NOW]


def call(id_, name, args):
    return {'id': id_, 'type': 'function', 'function': {'name': name, 'arguments': json.dumps(args, ensure_ascii=False)}}


def asst(content, *calls):
    return {'role': 'assistant', 'content': content, 'tool_calls': list(calls)}


def toolmsg(id_, name, content):
    return {'role': 'tool', 'tool_call_id': id_, 'name': name, 'content': content}


SYS = {'role': 'system', 'content': 'You are a helpful assistant.'}
U1 = {'role': 'user', 'content': 'What is the weather in Z\u00fcrich?'}
U2 = {'role': 'user', 'content': ' And in Paris? '}
C1 = call('abc123XYZ', 'get_weather', {'city': 'Z\u00fcrich', 'unit': 'celsius'})
C2 = call('def456UVW', 'search_docs', {'query': 'umbrella "rain"', 'limit': 3, 'threshold': 0.25,
                                       'filters': [{'field': 'title'}], 'options': {}})
C3 = call('ghi789RST', 'get_time', {})
R1 = toolmsg('abc123XYZ', 'get_weather', '{"temperature": 21.5, "unit": "celsius"}')
R2 = toolmsg('def456UVW', 'search_docs', 'No results.\nTry again.')
R3 = toolmsg('ghi789RST', 'get_time', '12:00')

# (name, messages, with tools, add_generation_prompt)
CONVS = [
    ('system+user', [SYS, U1], True, True),
    ('user', [U1], True, True),
    ('user-nogen', [U1], True, False),
    ('call+result', [SYS, U1, asst(None, C1), R1], True, True),
    ('call+result-then-answer', [U1, asst(None, C1), R1, {'role': 'assistant', 'content': 'It is 21.5 C.'}, U2], True, True),
    ('content+call', [U1, asst('Let me check.', C1), R1], True, True),
    ('two-calls+two-results', [SYS, U1, asst(None, C1, C2), R1, R2], True, True),
    ('empty-args', [U1, asst(None, C3), R3], True, False),
    ('no-tools', [SYS, U1, {'role': 'assistant', 'content': 'Hi.'}, U2], False, True),
    ('no-tools-user', [U1], False, True),
]


def for_template(msgs):
    """Tool-call arguments as dicts, what the templates are written for."""
    out = copy.deepcopy(msgs)
    for m in out:
        for c in m.get('tool_calls') or []:
            c['function']['arguments'] = json.loads(c['function']['arguments'])
        if m.get('role') == 'assistant' and not m.get('tool_calls'):
            m.pop('tool_calls', None)
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit('usage: make_toolcall_ref.py TEMPLATE_DIR')
    out = {'templates': {}, 'tools': TOOLS, 'cases': []}
    for tname, (fname, family, fmt, bos, eos) in TEMPLATES.items():
        with open(os.path.join(sys.argv[1], fname), encoding='utf-8') as f:
            text = f.read()
        out['templates'][tname] = {'family': family, 'format': fmt, 'file': fname}
        for cname, msgs, with_tools, gen in CONVS:
            case = {'template': tname, 'conversation': cname, 'family': family, 'format': fmt, 'bos': bos,
                    'eos': eos, 'gen': gen, 'tools': with_tools, 'messages': msgs}
            if not with_tools and fmt != 'mistral':
                case['no_tools'] = True
                out['cases'].append(case)
                continue
            if not with_tools:
                case['no_tools'] = True
            try:
                rendered, _ = render_jinja_template(conversations=[for_template(msgs)],
                                                    tools=TOOLS if with_tools else None, chat_template=text,
                                                    add_generation_prompt=gen, bos_token=bos or '',
                                                    eos_token=eos)
                case['text'] = rendered[0]
            except Exception as e:  # the template's raise_exception
                case['error'] = str(e)
            out['cases'].append(case)
    with open(OUT, 'w', encoding='utf-8') as f:
        json.dump(out, f, indent=1, ensure_ascii=True)
        f.write('\n')
    print(f'wrote {OUT}: {len(out["cases"])} cases', file=sys.stderr)


if __name__ == '__main__':
    main()
