"""Training as the pipeline runs it: the model registry (zoo), the train job, hyperparameter search and its
study storage."""
