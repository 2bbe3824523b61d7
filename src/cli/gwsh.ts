#!/usr/bin/env node
// Client CLI: log in and reach servers, databases, apps and clusters through the gateway.
// No subcommands yet: this prints its usage (see the open issues for what comes next).
import { newProgram, runCli } from './run.js';

const program = newProgram('gwsh', 'Client CLI: log in and reach servers, databases, apps and clusters through the gateway.');
program.action(() => {
  program.outputHelp();
});
await runCli(program);
