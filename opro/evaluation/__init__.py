"""Answer, then judge: the engine that streams (prompt, question) pairs, batch evaluation and its rows."""
