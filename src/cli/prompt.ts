/**
 * Passwords from a person (prompted on the terminal, not echoed) or from a script (the first line of standard
 * input when it is not a terminal).
 */
import { GatewayError } from '../errors.js';

async function readStdinLine(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) {
    chunks.push(chunk as Buffer);
    if (Buffer.concat(chunks).includes(0x0a)) break;
  }
  const text = Buffer.concat(chunks).toString('utf8');
  const line = text.split(/\r?\n/)[0] ?? '';
  return line;
}

async function promptHidden(question: string): Promise<string> {
  const stdin = process.stdin;
  process.stderr.write(question);
  stdin.setRawMode(true);
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
            reject(new GatewayError('GW_ERR_USAGE', 'cancelled'));
            return;
          }
          if (ch === '\u007f' || ch === '\b') value = value.slice(0, -1);
          else value += ch;
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
  const first = await promptHidden(question);
  if (options.confirm) {
    const second = await promptHidden('Confirm password: ');
    if (first !== second) throw new GatewayError('GW_ERR_USAGE', 'the two passwords differ');
  }
  return first;
}
