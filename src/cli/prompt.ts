/**
 * Passwords from a person (prompted on the terminal, not echoed) or from a script (the first line of standard
 * input when it is not a terminal). A new password is typed twice; two that differ are asked for again, at most
 * PASSWORD_TRIES times, then GW_ERR_CLIENT_PASSWORD_MISMATCH (nothing was changed).
 */
import { GatewayError } from '../errors.js';

/**
 * How much a password read here may hold (characters typed, or bytes of the first line of standard input): more
 * than the Auth Service accepts (1024), so that it is the one to say a long password is too long; beyond this it is
 * not a password (a file piped by mistake, or a script that never ends its line) and reading stops.
 */
export const PROMPT_MAX = 4096;

function tooLong(where: string): GatewayError {
  return new GatewayError('GW_ERR_USAGE', `${where} is longer than ${PROMPT_MAX} characters: not a password; nothing was changed`, {
    hint: 'Give the password alone as the first line of standard input (printf %s\\n "$PASSWORD" | ...), or run on a terminal to be prompted.',
  });
}

async function readStdinLine(): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of process.stdin) {
    const buf = chunk as Buffer;
    const newline = buf.indexOf(0x0a);
    chunks.push(newline === -1 ? buf : buf.subarray(0, newline));
    size += newline === -1 ? buf.length : newline;
    if (size > PROMPT_MAX) {
      process.stdin.destroy();
      throw tooLong('the first line of standard input');
    }
    if (newline !== -1) break;
  }
  return Buffer.concat(chunks).toString('utf8').replace(/\r$/, '');
}

async function promptHidden(question: string): Promise<string> {
  const stdin = process.stdin;
  // Raw mode before the question: what is typed as soon as it shows is neither echoed nor cut at the terminal's
  // line buffer (4095 characters in canonical mode), which would hide a long paste from the cap below.
  stdin.setRawMode(true);
  process.stderr.write(question);
  stdin.resume();
  let value = '';
  try {
    return await new Promise<string>((resolve, reject) => {
      const onData = (buf: Buffer) => {
        for (const ch of buf.toString('utf8')) {
          if (ch === '\r' || ch === '\n') {
            stdin.off('data', onData);
            process.stderr.write('\n');
            resolve(value);
            return;
          }
          if (ch === '\u0003') {
            stdin.off('data', onData);
            reject(new GatewayError('GW_ERR_USAGE', 'cancelled (Ctrl-C); nothing was changed', { hint: 'Run the command again when you are ready to type the password.' }));
            return;
          }
          if (ch === '\u007f' || ch === '\b') value = value.slice(0, -1);
          else value += ch;
          if (value.length > PROMPT_MAX) {
            stdin.off('data', onData);
            process.stderr.write('\n');
            reject(tooLong('the password typed'));
            return;
          }
        }
      };
      stdin.on('data', onData);
    });
  } finally {
    stdin.setRawMode(false);
    stdin.pause();
  }
}

/** Reads a password: prompted (twice with confirm) on a terminal, else the first line of standard input. */
export async function readPassword(question: string, options: { confirm?: boolean } = {}): Promise<string> {
  if (!process.stdin.isTTY) {
    const line = await readStdinLine();
    if (line === '') {
      throw new GatewayError('GW_ERR_USAGE', 'no password on standard input', { hint: 'Pipe the password as the first line, or run on a terminal to be prompted.' });
    }
    return line;
  }
  if (!options.confirm) return promptHidden(question);
  for (let attempt = 1; ; attempt++) {
    const first = await promptHidden(question);
    const second = await promptHidden('Confirm password: ');
    if (first === second) return first;
    if (attempt >= PASSWORD_TRIES) {
      throw new GatewayError('GW_ERR_CLIENT_PASSWORD_MISMATCH', `the two passwords did not match, ${PASSWORD_TRIES} times; nothing was changed`, {
        hint: 'Run the command again and type the same password twice (or pipe it as the first line of standard input).',
      });
    }
    process.stderr.write(`The two passwords did not match; type them again (${PASSWORD_TRIES - attempt} ${PASSWORD_TRIES - attempt === 1 ? 'try' : 'tries'} left).\n`);
  }
}

/** How many times a new password and its confirmation may differ before the command gives up. */
export const PASSWORD_TRIES = 3;
