"""A web-like workload: many short pure-Python calls per request.

Usage: web.py SNAPSHOT_PATH MAX_SECONDS

Each request (serve -> handle_request) builds a context of 25 catalogue items, renders an
HTML page with a small template engine written in Python (render_page: a node tree with
loops, conditionals, attribute lookups and filters such as escape and money), then encodes a
JSON response with a pure-Python encoder (encode_payload: recursive encode_value /
encode_dict / encode_list / encode_str with per-character escaping). Thousands of calls of a
few microseconds each, as in template rendering or serialization in a web application.

The workload measures the CPU time of render_page and of encode_payload itself
(time.thread_time() around each call): the known split a profile must reproduce.
One unit of work ("iters") is one request. Runs unchanged on CPython 3.8 ... 3.15.
"""
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

TEMPLATE = """<!doctype html>
<html><head><title>{{ title|escape }}</title></head>
<body>
<h1>{{ shop.name|upper }}</h1>
<p>{{ greeting|escape }}, {{ user.name|title }}!</p>
<ul class="items">
{% for item in items %}
  <li id="item-{{ item.id }}" class="{{ item.kind }}">
    <a href="/items/{{ item.slug }}">{{ item.name|escape }}</a>
    {% if item.on_sale %}<span class="sale">{{ item.price|money }}</span>{% endif %}
    {% if item.tags %}<small>{% for tag in item.tags %}#{{ tag|escape }} {% endfor %}</small>{% endif %}
  </li>
{% endfor %}
</ul>
<footer>{{ footer|escape }}</footer>
</body></html>
"""

TOKEN = re.compile(r"({{.*?}}|{%.*?%})", re.S)


class Text(object):
    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text

    def render(self, ctx, out):
        out.append(self.text)


class Var(object):
    __slots__ = ("path", "filters")

    def __init__(self, expr):
        parts = [p.strip() for p in expr.split("|")]
        self.path = parts[0].split(".")
        self.filters = parts[1:]

    def render(self, ctx, out):
        value = resolve(ctx, self.path)
        for name in self.filters:
            value = apply_filter(name, value)
        out.append(value if isinstance(value, str) else str(value))


class For(object):
    __slots__ = ("var", "seq", "body")

    def __init__(self, var, seq, body):
        self.var = var
        self.seq = seq.split(".")
        self.body = body

    def render(self, ctx, out):
        for value in resolve(ctx, self.seq):
            inner = Scope(ctx, self.var, value)
            render_nodes(self.body, inner, out)


class If(object):
    __slots__ = ("cond", "body")

    def __init__(self, cond, body):
        self.cond = cond.split(".")
        self.body = body

    def render(self, ctx, out):
        if resolve(ctx, self.cond):
            render_nodes(self.body, ctx, out)


class Scope(object):
    __slots__ = ("parent", "name", "value")

    def __init__(self, parent, name, value):
        self.parent = parent
        self.name = name
        self.value = value

    def lookup(self, name):
        if name == self.name:
            return self.value
        return lookup(self.parent, name)


def lookup(ctx, name):
    if isinstance(ctx, Scope):
        return ctx.lookup(name)
    return ctx.get(name, "")


def resolve(ctx, path):
    value = lookup(ctx, path[0])
    for key in path[1:]:
        if isinstance(value, dict):
            value = value.get(key, "")
        else:
            value = getattr(value, key, "")
    return value


def escape(value):
    out = []
    for ch in str(value):
        if ch == "<":
            out.append("&lt;")
        elif ch == ">":
            out.append("&gt;")
        elif ch == "&":
            out.append("&amp;")
        elif ch == '"':
            out.append("&quot;")
        else:
            out.append(ch)
    return "".join(out)


def money(value):
    cents = int(round(value * 100))
    return "$%d.%02d" % (cents // 100, cents % 100)


FILTERS = {"escape": escape, "upper": lambda v: str(v).upper(), "title": lambda v: str(v).title(), "money": money}


def apply_filter(name, value):
    return FILTERS[name](value)


def parse(source):
    tokens = TOKEN.split(source)
    root = []
    stack = [(None, root)]
    for tok in tokens:
        if tok.startswith("{{"):
            stack[-1][1].append(Var(tok[2:-2].strip()))
        elif tok.startswith("{%"):
            words = tok[2:-2].split()
            if words[0] == "for":
                node = For(words[1], words[3], [])
                stack[-1][1].append(node)
                stack.append((node, node.body))
            elif words[0] == "if":
                node = If(words[1], [])
                stack[-1][1].append(node)
                stack.append((node, node.body))
            elif words[0] in ("endfor", "endif"):
                stack.pop()
        elif tok:
            stack[-1][1].append(Text(tok))
    return root


def render_nodes(nodes, ctx, out):
    for node in nodes:
        node.render(ctx, out)


COMPILED = parse(TEMPLATE)


def render_page(ctx):
    out = []
    render_nodes(COMPILED, ctx, out)
    return "".join(out)


def encode_str(s, out):
    out.append('"')
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch < " ":
            out.append("\\u%04x" % ord(ch))
        else:
            out.append(ch)
    out.append('"')


def encode_list(items, out):
    out.append("[")
    first = True
    for item in items:
        if not first:
            out.append(",")
        first = False
        encode_value(item, out)
    out.append("]")


def encode_dict(d, out):
    out.append("{")
    first = True
    for key in d:
        if not first:
            out.append(",")
        first = False
        encode_str(key, out)
        out.append(":")
        encode_value(d[key], out)
    out.append("}")


def encode_value(v, out):
    if isinstance(v, str):
        encode_str(v, out)
    elif v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, (int, float)):
        out.append(repr(v))
    elif isinstance(v, dict):
        encode_dict(v, out)
    else:
        encode_list(v, out)


def encode_payload(payload):
    out = []
    encode_value(payload, out)
    return "".join(out)


KINDS = ["book", "game", "tool", "food", "toy"]


def build_context(n):
    items = []
    for i in range(25):
        k = (n + i) % 97
        items.append({
            "id": k,
            "slug": "item-%d-%s" % (k, KINDS[k % 5]),
            "name": "Item <%d> & \"friends\"" % k,
            "kind": KINDS[k % 5],
            "price": 3.5 + k * 1.25,
            "on_sale": k % 3 == 0,
            "tags": ["t%d" % (k % 7), "x<%d>" % (k % 4)] if k % 2 else [],
        })
    return {
        "title": "Catalogue page %d" % n,
        "shop": {"name": "pyperch & sons"},
        "greeting": "Hello <friend>",
        "user": {"name": "ada lovelace"},
        "items": items,
        "footer": "(c) 2026 \"pyperch\" <bench>",
    }


def handle_request(h, n, clock):
    ctx = build_context(n)
    t0 = clock()
    page = render_page(ctx)
    t1 = clock()
    body = encode_payload({"status": 200, "page": page, "items": ctx["items"], "request": n})
    t2 = clock()
    h.cpu["render_page"] += t1 - t0
    h.cpu["encode_payload"] += t2 - t1
    return len(body)


def serve(h):
    clock = time.thread_time
    h.cpu["render_page"] = 0.0
    h.cpu["encode_payload"] = 0.0
    h.iters["requests"] = 0
    h.ready()
    n = 0
    while not h.expired():
        handle_request(h, n, clock)
        n += 1
        h.iters["requests"] = n


def main():
    h = _harness.Harness()
    serve(h)


if __name__ == "__main__":
    main()
