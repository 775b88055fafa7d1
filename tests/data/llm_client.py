"""Calls an LLM API with the provider's official Python SDK (`openai`, `anthropic`,
`google-genai`) through the proxy, trusting the proxy's interception CA, and prints one JSON
report: a list with one entry per call — `ok`, the text or the SDK's error (`status`,
`message`, the error body's `type`).

usage: llm_client.py KIND BASE_URL PROXY CA SPEC_JSON

KIND: chat, chat_plain (base_url http://), chat_stream, responses, responses_stream, models,
messages, messages_stream, gemini, gemini_stream. SPEC: {"model", "max_tokens", "headers", "tools", "extra_body", "parallel", "key", "no_usage",
"hang_up_after" (messages_stream: close after that many text events)}.
The SDKs never retry (max_retries=0): what the proxy answers is what the test sees.
"""
import json
import sys
from concurrent.futures import ThreadPoolExecutor

KIND, BASE, PROXY, CA, SPEC = sys.argv[1:6]
spec = json.loads(SPEC)
model = spec.get("model", "gpt-4o-mini")
max_tokens = spec.get("max_tokens", 50)
headers = spec.get("headers", {})
tools = spec.get("tools")
extra_body = spec.get("extra_body")
key = spec.get("key", "placeholder-key")


def openai_call():
    import openai

    client = openai.OpenAI(base_url=BASE, api_key=key, max_retries=0, default_headers=headers,
                           http_client=openai.DefaultHttpxClient(proxy=PROXY, verify=CA))
    max_tokens = spec.get("max_tokens", 50)
    if max_tokens is None:
        max_tokens = openai.NOT_GIVEN  # the call names no output bound
    try:
        if KIND in ("chat", "chat_plain"):
            r = client.chat.completions.create(model=model, max_tokens=max_tokens, extra_body=extra_body,
                                               messages=[{"role": "user", "content": "hi"}])
            return {"ok": True, "text": r.choices[0].message.content, "usage": r.usage.total_tokens}
        if KIND == "chat_stream":
            text = ""
            usage = {} if spec.get("no_usage") else {"stream_options": {"include_usage": True}}
            for c in client.chat.completions.create(model=model, max_tokens=max_tokens, stream=True,
                                                    messages=[{"role": "user", "content": "hi"}], **usage):
                if c.choices:
                    text += c.choices[0].delta.content or ""
            return {"ok": True, "text": text}
        if KIND == "models":
            return {"ok": True, "models": [m.id for m in client.models.list()]}
        extra = {"tools": tools} if tools else {}
        if extra_body:
            extra["extra_body"] = extra_body
        if KIND == "responses":
            r = client.responses.create(model=model, max_output_tokens=max_tokens, input="hi", **extra)
            return {"ok": True, "text": r.output_text}
        if KIND == "responses_stream":
            n = 0
            for _ in client.responses.create(model=model, max_output_tokens=max_tokens, input="hi", stream=True, **extra):
                n += 1
            return {"ok": True, "events": n}
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"ok": False, "status": e.status_code, "message": e.message,
                "type": body.get("type") or (body.get("error") or {}).get("type")}


def anthropic_call():
    import anthropic

    client = anthropic.Anthropic(base_url=BASE, api_key=key, max_retries=0, default_headers=headers,
                                 http_client=anthropic.DefaultHttpxClient(proxy=PROXY, verify=CA))
    extra = {"tools": tools} if tools else {}
    if extra_body:
        extra["extra_body"] = extra_body
    try:
        if KIND == "messages":
            r = client.messages.create(model=model, max_tokens=max_tokens,
                                       messages=[{"role": "user", "content": "hi"}], **extra)
            return {"ok": True, "text": r.content[0].text}
        hang_up = spec.get("hang_up_after")
        with client.messages.stream(model=model, max_tokens=max_tokens,
                                    messages=[{"role": "user", "content": "hi"}], **extra) as s:
            text = ""
            for i, t in enumerate(s.text_stream):
                text += t
                if hang_up is not None and i + 1 >= hang_up:
                    # The client hangs up before the usage the provider sends last.
                    return {"ok": True, "text": text, "hung_up": True}
        return {"ok": True, "text": text}
    except anthropic.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"ok": False, "status": e.status_code, "message": e.message,
                "type": (body.get("error") or {}).get("type")}


def gemini_call():
    from google import genai
    from google.genai import errors, types

    client = genai.Client(api_key=key, http_options=types.HttpOptions(
        base_url=BASE, headers=headers, client_args={"proxy": PROXY, "verify": CA}))
    cfg = types.GenerateContentConfig(max_output_tokens=max_tokens)
    try:
        if KIND == "gemini":
            r = client.models.generate_content(model=model, contents="hi", config=cfg)
            return {"ok": True, "text": r.text}
        text = ""
        for c in client.models.generate_content_stream(model=model, contents="hi", config=cfg):
            text += c.text or ""
        return {"ok": True, "text": text}
    except errors.APIError as e:
        return {"ok": False, "status": e.code, "message": e.message, "type": e.status}


call = {"chat": openai_call, "chat_stream": openai_call, "responses": openai_call, "models": openai_call, "chat_plain": openai_call,
        "responses_stream": openai_call, "messages": anthropic_call,
        "messages_stream": anthropic_call, "gemini": gemini_call, "gemini_stream": gemini_call}[KIND]
n = spec.get("parallel", 1)
with ThreadPoolExecutor(max_workers=n) as pool:
    results = list(pool.map(lambda _: call(), range(n)))
print(json.dumps(results))
