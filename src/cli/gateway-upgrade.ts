#!/usr/bin/env node
// Automatic agent upgrader for systemd Linux hosts.
// No subcommands yet: this prints its usage (see the open issues for what comes next).
import { newProgram, runCli } from './run.js';

const program = newProgram('gateway-upgrade', 'Automatic agent upgrader for systemd Linux hosts.');
program.action(() => {
  program.outputHelp();
});
await runCli(program);
