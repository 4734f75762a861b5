"""The batch tool's machinery: a batch is planned (`plan`, with `template` references and
`pending` checks of what a preset's parameters will fill in), then run by the `engine`,
which undoes a transactional batch's done operations through their `compensation`.

The tools themselves (``batch``, presets) are `ctxactors.servers.batch`.
"""
