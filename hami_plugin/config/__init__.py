"""The settings layer both daemons and `hami certs` use: one grammar per kind of value, and
flag > environment > file precedence, resolved and validated once at start.

`values` holds the grammars (Go's booleans and durations, numbers, lists), `ConfigError` and
its exit status; `sources` the layers a command stacks and resolves; `options` the table each
command declares its settings in (`deviceplugin.settings`, `extender.settings`,
`certs.command`), the one place the environment is read; `device_config` HAMi's device config
file, read as HAMi reads it; `keys` the booking key file.
"""

from hami_plugin.config.sources import (
    Layer,
    add_bool_flag,
    env_layer,
    flag_dest,
    flag_layer,
    parse_setting,
    pick,
    read_yaml,
    resolve,
)
from hami_plugin.config.values import (
    BOOL_SPELLINGS,
    EXIT_USAGE,
    KLOG_DEBUG_VERBOSITY,
    LOG_LEVELS,
    ConfigError,
    parse_bool,
    parse_duration,
    parse_float,
    parse_int,
    parse_int_set,
    parse_klog_verbosity,
    parse_optional_str,
    parse_str,
    parse_str_set,
    split_list,
)

__all__ = [
    "BOOL_SPELLINGS",
    "EXIT_USAGE",
    "KLOG_DEBUG_VERBOSITY",
    "LOG_LEVELS",
    "ConfigError",
    "Layer",
    "add_bool_flag",
    "env_layer",
    "flag_dest",
    "flag_layer",
    "parse_bool",
    "parse_duration",
    "parse_float",
    "parse_int",
    "parse_int_set",
    "parse_klog_verbosity",
    "parse_optional_str",
    "parse_setting",
    "parse_str",
    "parse_str_set",
    "pick",
    "read_yaml",
    "resolve",
    "split_list",
]
