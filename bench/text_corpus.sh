#!/bin/bash
# A corpus of English prose from what a Debian 12 machine ships, for runs that need more text
# than a model can memorise: the FP8-vs-BF16 loss check (a Llama-1B-like model, 1,000 steps of
# 2-4 GPUs x micro-batch 4 x 2,048 tokens, 16-33M tokens) must train on text it sees about
# once, where the 245 KB of fortunes (bench/fortunes_corpus.sh) is learnt by heart.
#
#   bench/text_corpus.sh OUT_DIR [MB]
#
# writes OUT_DIR/corpus/SOURCE/NAME.txt, one document per file (`trainctl data prepare` and
# `train-tokenizer` take the folder as it is, no --doc-separator), and OUT_DIR/corpus.tar.xz
# (the folder, xz -9e; `tar -xJf` unpacks it), OUT_DIR/corpus.tsv (each file and its bytes, in
# the order taken) and OUT_DIR/tokenizer-sample.txt (about WEFT_CORPUS_SAMPLE_MB, default 20,
# of its documents, picked by a hash of their paths, for `trainctl data train-tokenizer`), and
# prints what each source gave. The sources, in this order (a document is dropped when its
# text is already in, or when 80% of its lines of 20 characters or more are):
#   man      the English manual pages (/usr/share/man/man[1-8]; translations left out) but
#            gcloud's, rendered by man-db (`man --nh --nj -l`, 80 columns, plain text)
#   info     the Texinfo manuals (/usr/share/info)
#   doc      /usr/share/doc: READMEs, NEWS, FAQs, release notes, text, Markdown, reST and
#            HTML (as text) manuals; not copyright or licence files, code, logs or data
#   python   the docstrings of Python's standard library and Debian's Python packages
#            (/usr/lib/python3.*, /usr/lib/python3/dist-packages; tests left out)
#   cmake    CMake's reference (/usr/share/cmake-*/Help, reST)
#   gcloud   the Google Cloud CLI's manual pages (made from templates: half are dropped as
#            near-duplicates, and the rest packs 15:1)
#   perl     the POD of Perl's modules (/usr/share/perl, /usr/share/perl5,
#            /usr/lib/x86_64-linux-gnu/perl*), rendered by pod2text
#   vim      Vim's help (/usr/share/vim/vim*/doc)
#   changelog  /usr/share/doc's changelogs (Debian's and upstream's)
# MB (default 0: all of it) stops after that many megabytes of text, sources in the order
# above: the most varied prose first, then what packs best (xz: python 9.6:1, gcloud 15:1,
# the rest about 5:1), since the corpus travels compressed within a size limit.
# The same machine gives the same files (sorted walks; man-db renders the same).
# Needs python3, man-db (man), pod2text (perl), tar and xz. Takes about 35 minutes on 2 cores:
# rendering the manual pages (25 minutes, 20 of them gcloud's), then xz.
set -euo pipefail
OUT=${1:?usage: bench/text_corpus.sh OUT_DIR [MB]}
MB=${2:-0}
# WEFT_CORPUS_SOURCES (default: all, in the order above) picks and orders the sources.
SOURCES=${WEFT_CORPUS_SOURCES:-man info doc python cmake gcloud perl vim changelog}
for tool in python3 man pod2text tar xz; do
  command -v "$tool" >/dev/null || { echo "text_corpus: $tool is missing" >&2; exit 2; }
done
mkdir -p "$OUT"
rm -rf "$OUT/corpus" "$OUT/corpus.tar.xz" "$OUT/corpus.tsv" "$OUT/tokenizer-sample.txt"
python3 - "$OUT/corpus" "$MB" $SOURCES <<'PY'
import ast, glob, gzip, hashlib, html, html.parser, inspect, multiprocessing, os, re, subprocess
import sys, time

out, limit = sys.argv[1], float(sys.argv[2]) * 1e6
sources = sys.argv[3:]
os.makedirs(out)

def walk(root):
    """Regular files under root (not symlinks), in path order."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for f in sorted(filenames):
            p = os.path.join(dirpath, f)
            if not os.path.islink(p) and os.path.isfile(p):
                yield p

def read(path, nul=False):
    """The UTF-8 text of a file (gunzipped), or None; NUL bytes mean a binary file unless nul
    (Texinfo marks index entries with NUL and backspace)."""
    data = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    if nul:
        data = re.sub(rb"\0\x08\[[^\0]*\0\x08\]", b"", data)
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
def clean(text):
    """Plain lines: no CRs or control characters, no trailing blanks, at most one empty line
    in a row, no empty lines at either end."""
    text = CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n").replace("\f", "\n"))
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n") + "\n"

def prose(text):
    """Most of its visible characters are letters (code and tables are mostly not)."""
    visible = sum(1 for c in text if not c.isspace())
    return visible > 0 and sum(1 for c in text if c.isalpha()) / visible >= 0.6

# ---- manual pages
def render_man(path):
    env = dict(os.environ, MANWIDTH="80", MANPAGER="cat", LC_ALL="C.UTF-8")
    try:
        r = subprocess.run(["man", "--nh", "--nj", "-l", path], env=env, capture_output=True,
                           timeout=120)
    except subprocess.TimeoutExpired:
        return None
    try:
        text = r.stdout.decode("utf-8")
    except UnicodeDecodeError:
        return None
    lines = text.split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    # The running head and foot (NAME(1) ... NAME(1)); a long head takes two lines.
    lines = lines[lines.index("NAME") if "NAME" in lines[:4] else 1:-1]
    # The body's 7-column indent.
    return "\n".join(l[7:] if l.startswith(" " * 7) else l.lstrip() for l in lines)

def man_pages(gcloud):
    for section in sorted(glob.glob("/usr/share/man/man[1-8]")):
        for p in walk(section):
            if os.path.basename(p).startswith("gcloud") == gcloud:
                yield p

def man_docs(gcloud):
    paths = list(man_pages(gcloud))
    with multiprocessing.Pool(os.cpu_count()) as pool:
        for p, text in zip(paths, pool.imap(render_man, paths, chunksize=8)):
            if text:
                yield os.path.basename(p).removesuffix(".gz"), text

# ---- info
def info_docs():
    for p in walk("/usr/share/info"):
        if p.endswith("/dir") or ".info" not in p:
            continue
        text = read(p, nul=True)
        if text:
            text = text.split("\x1f\nTag Table:")[0].split("\x1f\nEnd Tag Table")[0]
            text = re.sub(r"^\x1f\nFile: [^\n]*\n", "", text, flags=re.M)
            yield os.path.basename(p).removesuffix(".gz"), text

# ---- /usr/share/doc
class HtmlText(html.parser.HTMLParser):
    BLOCK = {"p", "div", "br", "li", "ul", "ol", "h1", "h2", "h3", "h4", "h5", "h6", "tr",
             "table", "dd", "dt", "dl", "pre", "blockquote", "section", "article", "hr",
             "title", "header", "footer"}
    SKIP = {"script", "style", "head", "nav"}
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.skip, self.pre = [], 0, 0
    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP: self.skip += 1
        if tag == "pre": self.pre += 1
        if tag in self.BLOCK: self.parts.append("\n\n" if tag in ("p", "pre") or tag[0] == "h" else "\n")
    def handle_endtag(self, tag):
        if tag in self.SKIP: self.skip = max(0, self.skip - 1)
        if tag == "pre": self.pre = max(0, self.pre - 1)
        if tag in self.BLOCK: self.parts.append("\n\n" if tag in ("p", "pre") or tag[0] == "h" else "\n")
    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data if self.pre else re.sub(r"\s+", " ", data))
def html_text(text):
    parser = HtmlText()
    parser.feed(text)
    parser.close()
    return "\n".join(l.strip() if not l.startswith("    ") else l
                     for l in "".join(parser.parts).split("\n"))

DOC_EXT = {"", ".txt", ".md", ".markdown", ".rst", ".html", ".htm", ".adoc", ".text", ".old",
           ".debian", ".asciidoc", ".texi", ".ja", ".en"}
LICENSE = re.compile(r"^(copyright|copying|licen[cs]e|notice|authors|thanks|credits|"
                     r"contributors|patents|debian-copyright)", re.I)
JUNK = re.compile(r"test[-_]?(results|summary)|^status\.txt$|\.log$")
def doc_files(changelogs):
    for p in walk("/usr/share/doc"):
        name = os.path.basename(p).removesuffix(".gz")
        low = name.lower()
        if LICENSE.match(low) or "license" in low or low.startswith("changelog") != changelogs:
            continue
        stem, ext = os.path.splitext(low)
        if not changelogs and ext not in DOC_EXT and not ext.endswith("releasenotes") \
                and not stem.startswith(("readme", "news", "faq", "todo", "bugs", "history")):
            continue
        # Makefiles, build files and other extensionless code.
        if stem in ("makefile", "cmakelists", "configure", "gnumakefile") or low.endswith(".in"):
            continue
        # Test logs and tables.
        if JUNK.search(low):
            continue
        # HTML beside Markdown is its rendering (Node's API: each page, and all of them in one).
        if ext in (".html", ".htm") and glob.glob(os.path.join(glob.escape(os.path.dirname(p)), "*.md*")):
            continue
        yield p

def doc_docs(changelogs):
    for p in doc_files(changelogs):
        text = read(p)
        if text is None:
            continue
        if p.removesuffix(".gz").lower().endswith((".html", ".htm")):
            text = html_text(text)
        if changelogs or prose(text):
            yield os.path.relpath(p, "/usr/share/doc").removesuffix(".gz"), text

# ---- Vim, CMake
def vim_docs():
    for d in sorted(glob.glob("/usr/share/vim/vim*/doc")):
        for p in walk(d):
            if p.endswith((".txt", ".txt.gz")):
                text = read(p)
                if text:
                    yield os.path.basename(p).removesuffix(".gz"), text

def cmake_docs():
    for d in sorted(glob.glob("/usr/share/cmake-*/Help")):
        for p in walk(d):
            if p.endswith((".rst", ".txt")):
                text = read(p)
                if text:
                    yield os.path.relpath(p, d), text

# ---- Perl's POD
def pod_text(path):
    r = subprocess.run(["pod2text", "-l", path], capture_output=True,
                       env=dict(os.environ, LC_ALL="C.UTF-8"))
    try:
        return r.stdout.decode("utf-8") if r.returncode == 0 else None
    except UnicodeDecodeError:
        return None

def perl_docs():
    roots = ["/usr/share/perl", "/usr/share/perl5"] + sorted(glob.glob("/usr/lib/x86_64-linux-gnu/perl*"))
    paths, real = [], set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            for f in sorted(filenames):
                p = os.path.join(dirpath, f)
                rp = os.path.realpath(p)
                if f.endswith((".pm", ".pod")) and rp not in real and os.path.isfile(rp):
                    real.add(rp)
                    with open(rp, "rb") as fh:
                        if re.search(rb"^=head1", fh.read(), re.M):
                            paths.append(p)
    with multiprocessing.Pool(os.cpu_count()) as pool:
        for p, text in zip(paths, pool.imap(pod_text, paths, chunksize=8)):
            if text:
                yield p.lstrip("/"), text

# ---- Python docstrings
def docstrings(path):
    try:
        tree = ast.parse(open(path, "rb").read())
    except (SyntaxError, ValueError, RecursionError):
        return None
    parts = []
    def visit(node, prefix):
        doc = ast.get_docstring(node, clean=True)
        if isinstance(node, ast.Module):
            if doc: parts.append(doc)
        elif doc:
            parts.append(f"{prefix}{node.name}\n\n{doc}")
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, f"{prefix}{node.name}." if not isinstance(node, ast.Module) else prefix)
    visit(tree, "")
    return "\n\n".join(parts) if parts else None

def python_docs():
    roots = sorted(glob.glob("/usr/lib/python3.[0-9]*")) + ["/usr/lib/python3/dist-packages"]
    for root in roots:
        for p in walk(root):
            if not p.endswith(".py") or re.search(r"/(tests?|idle_test|testing)/", p):
                continue
            text = docstrings(p)
            if text:
                yield os.path.relpath(p, "/usr/lib"), text

SOURCES = {
    "man": lambda: man_docs(False), "info": info_docs, "doc": lambda: doc_docs(False),
    "vim": vim_docs, "cmake": cmake_docs, "perl": perl_docs, "python": python_docs,
    "changelog": lambda: doc_docs(True), "gcloud": lambda: man_docs(True),
}

seen_docs, seen_lines = set(), set()
def novel(text):
    """Whether text is new: not a copy of a document already in, nor 80% made of its lines."""
    h = hashlib.sha1(text.encode()).digest()
    if h in seen_docs:
        return False
    seen_docs.add(h)
    lines = {hash(" ".join(l.split())) for l in text.split("\n") if len(l.strip()) >= 20}
    if lines and len(lines & seen_lines) > 0.8 * len(lines):
        return False
    seen_lines.update(lines)
    return True

total, names = 0, set()
listing = open(os.path.join(os.path.dirname(out), "corpus.tsv"), "w")
print(f"{'source':10} {'docs':>7} {'dropped':>7} {'MB':>8} {'seconds':>7}")
for source in sources:
    start, kept, dropped, size = time.time(), 0, 0, 0
    os.makedirs(os.path.join(out, source))
    for name, text in SOURCES[source]() if not (limit and total >= limit) else ():
        if limit and total >= limit:
            break
        text = clean(text)
        if len(text) < 200 or not novel(text):
            dropped += 1
            continue
        name = re.sub(r"[^A-Za-z0-9._+-]", "_", name.replace("/", "__"))[:180]
        base, n = name, 1
        while name in names:
            n += 1
            name = f"{base}.{n}"
        names.add(name)
        data = text.encode()
        with open(os.path.join(out, source, name + ".txt"), "wb") as f:
            f.write(data)
        listing.write(f"{source}/{name}.txt\t{len(data)}\n")
        kept += 1
        size += len(data)
        total += len(data)
    print(f"{source:10} {kept:7} {dropped:7} {size / 1e6:8.2f} {time.time() - start:7.0f}", flush=True)
print(f"{'total':10} {len(names):7} {'':7} {total / 1e6:8.2f}")
PY
# A sample for training the tokenizer on (SentencePiece on the whole corpus is slow on 2 cores):
# the documents whose path hashes below SAMPLE_MB / the corpus's size, concatenated.
python3 - "$OUT" "${WEFT_CORPUS_SAMPLE_MB:-20}" <<'PY'
import hashlib, sys
out, mb = sys.argv[1], float(sys.argv[2])
files = [line.rstrip("\n").split("\t") for line in open(f"{out}/corpus.tsv")]
share = mb * 1e6 / max(1, sum(int(b) for _, b in files))
with open(f"{out}/tokenizer-sample.txt", "wb") as sample:
    for path, _ in files:
        if int(hashlib.sha1(path.encode()).hexdigest()[:8], 16) < share * 2**32:
            sample.write(open(f"{out}/corpus/{path}", "rb").read())
PY
# Sources in order, so that xz's window sees alike text together; one 192 MiB window for it all.
(cd "$OUT" && tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - corpus |
  xz -T1 --lzma2=preset=9e,dict=192MiB >corpus.tar.xz)
echo "corpus.tar.xz $(stat -c %s "$OUT/corpus.tar.xz") bytes," \
  "text $(du -sb --apparent-size "$OUT/corpus" | cut -f1) bytes (tar -xJf corpus.tar.xz)"
