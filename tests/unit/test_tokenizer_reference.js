// The reference GPT-2 encoder for test_tokenizer_gpt2.cpp: the npm package
// gpt-3-encoder. Usage: node test_tokenizer_reference.js ENCODER_JS INPUT
// INPUT holds documents separated by NUL bytes and is read as UTF-8 (invalid
// bytes become U+FFFD). Prints one line per document: its token ids.
'use strict';
const fs = require('fs');
const path = require('path');
const [encoderJs, input] = process.argv.slice(2);
const { encode } = require(path.resolve(encoderJs));
const docs = fs.readFileSync(input, 'utf8').split('\0');
fs.writeSync(1, docs.map((d) => encode(d).join(' ')).join('\n') + '\n');
