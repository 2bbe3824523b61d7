/**
 * What every CLI shares: turn a thrown error into `error: <message>` + `hint: <hint>` on standard error and a
 * non-zero exit status; a stack trace only with --debug. Commander's own usage errors go the same way.
 */
import { Command, CommanderError } from 'commander';
import { GatewayError, toGatewayError } from '../errors.js';

export { VERSION } from '../version.js';
import { VERSION } from '../version.js';

/** Exit statuses: 1 for a failure of the operation, 2 for a command line that cannot be understood. */
export const EXIT_FAILURE = 1;
export const EXIT_USAGE = 2;
/** The codes of a command line that cannot be understood (exit status 2): a bad flag, a bad --format. */
const USAGE_CODES: ReadonlySet<string> = new Set(['GW_ERR_USAGE', 'GW_ERR_OUTPUT_FORMAT']);

export function printError(err: unknown, debug: boolean, stderr: NodeJS.WritableStream = process.stderr): void {
  const gwErr = toGatewayError(err);
  stderr.write(`error: ${gwErr.message}\n`);
  if (gwErr.hint) stderr.write(`hint: ${gwErr.hint}\n`);
  stderr.write(`code: ${gwErr.code}\n`);
  if (debug) stderr.write(`${(gwErr.cause instanceof Error ? gwErr.cause : gwErr).stack ?? ''}\n`);
}

/** Common settings for a program: its name, version, --debug, and errors reported our way. */
export function newProgram(name: string, description: string): Command {
  const program = new Command(name)
    .description(description)
    .version(VERSION, '-v, --version', 'print the version')
    .option('--debug', 'print stack traces and debug logs')
    .showHelpAfterError(false)
    .exitOverride()
    .configureOutput({
      // Commander prints its own "error: ..." lines; route them through printError instead.
      outputError: () => undefined,
    });
  return program;
}

export async function runCli(program: Command, argv: string[] = process.argv): Promise<void> {
  const debug = argv.includes('--debug');
  try {
    await program.parseAsync(argv);
  } catch (err) {
    if (err instanceof CommanderError) {
      if (err.exitCode === 0) return; // --help, --version
      const message = err.message.replace(/^error:\s*/, '');
      printError(new GatewayError('GW_ERR_USAGE', message, { hint: `Run '${program.name()} --help' for usage.` }), debug);
      process.exitCode = EXIT_USAGE;
      return;
    }
    printError(err, debug);
    process.exitCode = err instanceof GatewayError && USAGE_CODES.has(err.code) ? EXIT_USAGE : EXIT_FAILURE;
  }
}
