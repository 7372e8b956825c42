"""setup.py compiles each folder's C++ files as one (a unity build): names in the files' anonymous
namespaces must then differ within a folder. Two same-named functions there would silently become
overloads of each other, which the compiler cannot flag."""

from __future__ import annotations

import collections
import pathlib
import re

CSRC = pathlib.Path(__file__).resolve().parents[2] / "csrc"
ANONYMOUS = re.compile(r"^namespace \{\n(.*?)^\} // namespace", re.M | re.S)
# What a line at the namespace's own level declares: a function (its name before "(", the
# return type possibly on the line before), a constant, a type or an alias.
DECLARED = re.compile(
    r"^(?:template <[^\n]*>\n)?"
    r"(?:(?:constexpr|const|inline|static|struct|class|enum class|enum|using)\s+)*"
    r"(?:[\w:<>,*&]+[ \n]+)*?(\w+)\s*(?:\(|=|\{|;|\[)",
    re.M,
)


def anonymous_names(text: str) -> set[str]:
    names = set()
    for block in ANONYMOUS.findall(text):
        # Only the namespace's own level: lines that start at column 0.
        top = "\n".join(
            line for line in block.split("\n") if line[:1] not in ("", " ", "}", "/", "#")
        )
        names.update(DECLARED.findall(top))
    return names - {"static_assert"}


def duplicates(folder_files: dict[pathlib.Path, list[pathlib.Path]]) -> dict[str, list[str]]:
    found = {}
    for folder, files in folder_files.items():
        owners = collections.defaultdict(list)
        for file in files:
            for name in anonymous_names(file.read_text()):
                owners[name].append(file.name)
        found.update({f"{folder.name}/{n}": f for n, f in owners.items() if len(f) > 1})
    return found


def test_anonymous_names_differ_within_each_folder():
    folders = collections.defaultdict(list)
    for file in sorted(CSRC.rglob("*.cpp")):
        folders[file.parent].append(file)
    assert duplicates(folders) == {}


def test_a_name_two_files_of_a_folder_share_is_found(tmp_path):
    first, second = tmp_path / "a.cpp", tmp_path / "b.cpp"
    first.write_text("namespace {\nconstexpr auto kPollInterval = 1;\n} // namespace\n")
    second.write_text("namespace {\nstd::string\ndescribe(int x) {\n}\n} // namespace\n")
    assert duplicates({tmp_path: [first, second]}) == {}
    second.write_text(
        "namespace {\nconstexpr std::chrono::milliseconds kPollInterval{10};\n} // namespace\n"
    )
    assert duplicates({tmp_path: [first, second]}) == {
        f"{tmp_path.name}/kPollInterval": ["a.cpp", "b.cpp"]
    }
