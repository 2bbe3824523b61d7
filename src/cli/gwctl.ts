#!/usr/bin/env node
// Admin CLI: manage users, roles, tokens and cluster resources.
// No subcommands yet: this prints its usage (see the open issues for what comes next).
import { newProgram, runCli } from './run.js';

const program = newProgram('gwctl', 'Admin CLI: manage users, roles, tokens and cluster resources.');
program.action(() => {
  program.outputHelp();
});
await runCli(program);
