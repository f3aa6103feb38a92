"""plugin_utils/template_cache.py: a template string is compiled once per run, the result rendered is what Ansible
renders without the cache, a template's own syntax header keeps its own entry, and a template with a backslash (whose
compiled code depends on how Ansible escapes it) is not kept."""

import pytest
from ansible.errors import AnsibleTemplateSyntaxError, AnsibleUndefinedVariable
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.trainyard.core.plugins.plugin_utils import template_cache as tc


@pytest.fixture
def cache():
    assert tc.install()
    yield tc
    tc.uninstall()


def render(template, variables=None, **options):
    return Templar(loader=DataLoader(), variables=variables or {}).template(trust_as_template(template), **options)


def test_a_template_compiles_once_and_renders_with_each_hosts_variables(cache):
    assert render("{{ a }}-{{ b | upper }}", {"a": 1, "b": "x"}) == "1-X"
    misses = cache.stats()["misses"]
    # another templar, another environment (a worker's): the compiled code is reused, the variables are its own
    assert render("{{ a }}-{{ b | upper }}", {"a": 2, "b": "y"}) == "2-Y"
    assert cache.stats()["misses"] == misses and cache.stats()["hits"] >= 1


def test_rendering_matches_ansible_without_the_cache(cache):
    cases = [("{{ x | default('d') }}", {}), ("{% for i in xs %}{{ i }},{% endfor %}", {"xs": [1, 2]}),
             ("{{ {'k': v} | dict2items | map(attribute='value') | list }}", {"v": 3}),
             ("a{# comment #}b", {}), ("{{ 'c:\\newfile' }}", {})]
    cached = [render(s, v) for s, v in cases] + [render(s, v) for s, v in cases]
    tc.uninstall()
    plain = [render(s, v) for s, v in cases]
    assert cached == plain + plain


def test_a_template_with_a_backslash_compiles_as_ansible_does_each_time(cache):
    # Ansible escapes backslashes in its own templates' string constants, not in others': compile() cannot see which
    on = render("{{ 'a\\1' }}")
    off = render("{{ 'a\\1' }}", escape_backslashes=False)
    assert on == "a\\1" and off == "a\x01"
    assert render("{{ 'a\\1' }}") == on and render("{{ 'a\\1' }}", escape_backslashes=False) == off
    assert cache.stats()["entries"] == 0


def test_a_templates_own_syntax_header_is_honoured(cache):
    header = "#jinja2:variable_start_string:'[%', variable_end_string:'%]'\n[% a %] {{ a }}"
    assert render(header, {"a": 5}) == "5 {{ a }}"
    assert render("[% a %] {{ a }}", {"a": 5}) == "[% a %] 5"


def test_a_template_that_does_not_compile_is_not_kept_and_fails_each_time(cache):
    for _ in range(2):
        with pytest.raises(AnsibleTemplateSyntaxError):
            render("{{ a + }}", {"a": 1})
    assert cache.stats()["entries"] == 0


def test_an_undefined_variable_still_fails_where_it_is_used(cache):
    for _ in range(2):
        with pytest.raises(AnsibleUndefinedVariable):
            render("{{ nope }}", {})


def test_prewarm_compiles_the_strings_a_task_will_render(cache):
    args = {"msg": "{{ a }}", "nested": [{"x": "{% if b %}y{% endif %}"}, "plain", 3], "same": "{{ a }}"}
    assert list(tc.template_strings(args)) == ["{{ a }}", "{% if b %}y{% endif %}", "{{ a }}"]
    assert tc.prewarm([args]) == 2
    assert tc.prewarm([args]) == 0  # already compiled
    misses = cache.stats()["misses"]
    assert render("{{ a }}", {"a": "v"}) == "v" and render("{% if b %}y{% endif %}", {"b": True}) == "y"
    assert cache.stats()["misses"] == misses
    entries = cache.stats()["entries"]
    assert tc.prewarm([{"bad": "{{ a + }}"}]) == 1 and cache.stats()["entries"] == entries
